"""Several machines per training job (`distributed.num_machines` > 1): the Kubernetes objects, the training stage's
watch over them, and what each pod runs. No Prefect task lives here."""
