"""grpoflow: GRPO fine-tuning as a Prefect pipeline.

The one top-level name grpoflow installs. The repository keeps its layers as top-level folders, and the build
backend's package-dir mapping (pyproject.toml) installs each as a subpackage of this one:

| folder | installed as | holds |
| --- | --- | --- |
| `core/` | `grpoflow.core` | the base: job spec, job folder, URIs, errors, policy, trust; no ML, no Prefect |
| `trainers/` | `grpoflow.trainers` | the ML: TRL training, datasets, rewards, graders, the model; no Prefect |
| `jobs/` | `grpoflow.jobs` | the job service: preflight, children, lock, report, registry, publish |
| `tasks/` | `grpoflow.tasks` | one Prefect task per pipeline stage |
| `integrations/` | `grpoflow.integrations` | what tasks call: storage, job folders, events, webhooks, Prefect server |
| `cluster/` | `grpoflow.cluster` | several machines per job on Kubernetes |
| `flows/` | `grpoflow.flows` | the Prefect flows and the `grpoflow` CLI |
| `api/` | `grpoflow.api` | the jobs API (`grpoflow api`): Veri's and OpenAI's fine-tuning API over the deployments |
| `examples/` | `grpoflow.examples` | the demo's spec, data and reward module |

`grpoflow.client` (this folder) is the jobs API's Python client, which imports only httpx2.

So a user's own `tasks.py`, `flows/` or `trainers/` never meets grpoflow's.
"""

__version__ = "0.1.0"
