"""Several machines per training job (`distributed.num_machines` > 1): the Kubernetes objects, the training stage's
watch over them, what each pod runs, and the checkpoint hand-over between machines. No Prefect task lives here."""
