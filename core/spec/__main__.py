"""Prints the GRPO hyperparameter table that the docs' spec reference page holds:
python -m grpoflow.core.spec
"""

from grpoflow.core.spec.docs import hyperparameter_table

print(hyperparameter_table())
