# The image the grpo-k8s pool's pods run (the build and push steps of prefect.yaml): CUDA PyTorch, then grpoflow
# with its GPU extras at the versions the tests ran on (constraints.txt), installed by scripts/install.sh, the command
# CI runs (`make install`). By hand, from the project folder:
#   docker build -t registry.example.com/ml/grpoflow:0.1.0 . && docker push registry.example.com/ml/grpoflow:0.1.0
# torch comes with the base image; keep its version equal to the Makefile's TORCH_VERSION (a test checks).
FROM pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime

# qlora, math, graders (OpenAI text_similarity graders), kubernetes (distributed.num_machines > 1) and gguf (a .gguf
# base_model) are the extras constraints.txt pins; vllm and deepspeed are not pinned there (their builds follow CUDA
# and torch closely), so they are opt-in: --build-arg EXTRAS=qlora,math,graders,kubernetes,gguf,deepspeed.
ARG EXTRAS=qlora,math,graders,kubernetes,gguf
# What a project of `grpoflow init` installs (from the package index pip uses, or a wheel in the project's wheels/
# folder); grpoflow's own checkout installs itself.
ARG GRPOFLOW_VERSION=0.1.0
ARG TORCH_VERSION=2.13.0
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Pods run as this user; the job's staging folder (~/.grpoflow/staging, uploaded to the s3:// output_uri) is its home.
RUN groupadd --gid 10001 grpoflow \
    && useradd --create-home --no-log-init --uid 10001 --gid 10001 grpoflow

# The project folder: deployments run their flows here (the pull step of the -k8s deployments), so the specs'
# relative paths resolve as they do on one machine.
WORKDIR /opt/project
COPY --chown=10001:10001 . .
RUN bash scripts/install.sh python "$EXTRAS"
# What the image needs beside the packages: bubblewrap, the sandbox python graders run in (trainers/graders/sandbox.py;
# without it, spec code from a deployment is refused; in a pod it needs user namespaces, as the README's "Security"
# section says), and WordNet for the meteor text_similarity grader (NLTK looks in /usr/share/nltk_data).
RUN bash scripts/install_sandbox.sh \
    && if python -c "import nltk" 2>/dev/null; then python -m nltk.downloader -q -d /usr/share/nltk_data wordnet; fi

USER 10001:10001
CMD ["grpoflow", "--help"]
