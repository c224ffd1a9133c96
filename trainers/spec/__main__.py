"""Prints the GRPO hyperparameter table that README.md's section "The job spec" holds: python -m trainers.spec"""

from trainers.spec.docs import hyperparameter_table

print(hyperparameter_table())
