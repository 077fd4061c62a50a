"""An MPIJob checked as Kubeflow's MPI Operator (v0.8.2) would check it, offline: against the
`openAPIV3Schema` of the operator's own CustomResourceDefinition (tests/data/, see its README),
the way the API server does with strict field validation, and against the operator's rule for the
job's name (pkg/apis/kubeflow/validation/validation.go at that release).
"""

import copy
import functools
import os
import re

import jsonschema
import yaml

__all__ = ["CRD_PATH", "MpiJobNameError", "mpijob_schema", "validate_mpijob", "validate_mpijob_name"]

CRD_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        "kubeflow.org_mpijobs.yaml")
# Kubernetes' DNS-1035 label: what the operator requires of `<name>-worker-<last index>`.
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1035_LABEL_MAX_LENGTH = 63


class MpiJobNameError(ValueError):
    """The MPIJob's name would make a worker's pod or Service name that is not a DNS-1035 label."""


def _unknown_fields_rejected(schema):
    # The CRD's structural schema leaves additionalProperties unset: the API server prunes unknown
    # fields, and with strict field validation (kubectl's default) refuses them. An object schema
    # with properties and no additionalProperties therefore gets `false` here, as the server does.
    if isinstance(schema, dict):
        for value in schema.values():
            _unknown_fields_rejected(value)
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        for value in schema:
            _unknown_fields_rejected(value)
    return schema


@functools.lru_cache(maxsize=1)
def _served_schema():
    with open(CRD_PATH) as file:
        crd = yaml.safe_load(file)
    (version,) = [version for version in crd["spec"]["versions"] if version["name"] == "v2beta1"]
    return crd["spec"]["group"], crd["spec"]["names"]["kind"], version["schema"]["openAPIV3Schema"]


def mpijob_schema():
    """The CRD's v2beta1 schema, with unknown fields refused (a copy, free to change).

    Returns:
        A JSON schema (draft 4 semantics, as Kubernetes' OpenAPI v3 subset) for a whole MPIJob.
    """
    return _unknown_fields_rejected(copy.deepcopy(_served_schema()[2]))


@functools.lru_cache(maxsize=1)
def _validator():
    return jsonschema.Draft4Validator(mpijob_schema())


def validate_mpijob_name(job):
    """Raise MpiJobNameError unless `<name>-worker-<replicas - 1>` is a DNS-1035 label.

    Args:
        job: the MPIJob, as loaded from YAML.
    """
    worker = job["spec"]["mpiReplicaSpecs"].get("Worker") or {}
    replicas = worker.get("replicas") or 1
    hostname = f"{job['metadata']['name']}-worker-{max(replicas, 1) - 1}"
    if len(hostname) > DNS_1035_LABEL_MAX_LENGTH or not DNS_1035_LABEL.fullmatch(hostname):
        raise MpiJobNameError(f"metadata.name {job['metadata']['name']!r}: the last worker's name {hostname!r} is "
                              f"not a DNS-1035 label of at most {DNS_1035_LABEL_MAX_LENGTH} characters")


def validate_mpijob(job):
    """Raise jsonschema.ValidationError or MpiJobNameError where the operator would refuse `job`.

    Args:
        job: the MPIJob, as loaded from YAML.
    """
    group, kind, _ = _served_schema()
    if job.get("apiVersion") != f"{group}/v2beta1" or job.get("kind") != kind:
        raise jsonschema.ValidationError(f"not a {group}/v2beta1 {kind}: {job.get('apiVersion')} {job.get('kind')}")
    error = jsonschema.exceptions.best_match(_validator().iter_errors(job))
    if error is not None:
        raise error
    validate_mpijob_name(job)
