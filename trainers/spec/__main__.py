"""Prints the GRPO hyperparameter table that the docs' spec reference page holds:
python -m grpoflow.trainers.spec
"""

from grpoflow.trainers.spec.docs import hyperparameter_table

print(hyperparameter_table())
