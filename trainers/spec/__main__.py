"""Prints the GRPO hyperparameter table that README.md's section "The job spec" holds:
python -m grpoflow.trainers.spec
"""

from grpoflow.trainers.spec.docs import hyperparameter_table

print(hyperparameter_table())
