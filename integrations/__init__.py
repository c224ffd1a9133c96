"""What the pipeline's tasks call to reach the services around them: storage (local paths and fsspec URIs), leases,
stage records in the job folder, Prefect events and artifacts, and signed webhooks. No Prefect task lives here."""
