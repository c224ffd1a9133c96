"""What the pipeline's tasks call to reach the services around them: storage (local paths and fsspec URIs), job
folders and their lookup, checkpoints kept on a remote store while training runs, leases, stage records, Prefect
events and artifacts, and signed webhooks. No Prefect task lives here."""
