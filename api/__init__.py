"""The jobs API (`grpoflow api`, docs/design.md "The jobs API"): FastAPI on uvicorn, over the Prefect server's
deployments. `app` builds the application (keys, errors, the routes); `store` keeps each team's jobs and files;
`training_jobs` is Veri's API, `fine_tuning` OpenAI's fine-tuning and files API, both over `jobs`.
"""
