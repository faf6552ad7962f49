"""Cluster and launch tooling, all offline: ``iclmem cluster-check`` on a ray-up file
(:mod:`~orchestrator.cluster.cluster`), a KubeRay manifest (:mod:`~orchestrator.cluster.kuberay`), the Slurm script
(:mod:`~orchestrator.cluster.slurm`) and the Dockerfile (:mod:`~orchestrator.cluster.image`), with the checks they share
(secrets, privileges: :mod:`~orchestrator.cluster.deploy_checks`). Imports only the schema."""
