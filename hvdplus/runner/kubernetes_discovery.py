"""`hvdplusrun --host-discovery kubernetes`: an elastic job's hosts are the pods that are Ready
and not terminating, among those a label selector picks in a namespace.

The launcher lists the pods through the Kubernetes API with the official client (`pip install
"hvdplus[kubernetes]"`) and the pod's service account (in-cluster config; the account needs
`list` on pods). Each pod is a host by its DNS name `<hostname>.<subdomain>` where the pod has
both (an Indexed Job's or the MPI Operator's pods), else by its address; each has
--slots-per-pod slots. The job grows onto a new Ready pod at its next commit, and a deleted pod
(terminating from the moment of its deletion) leaves it at once.

    hvdplusrun --min-np 2 --max-np 8 --host-discovery kubernetes --pod-selector app=train python train.py

Where the launcher may not read the API itself, --pod-list-file names a file that holds the pod
list in the same JSON, which something else keeps current (a sidecar running `kubectl get pods -o
json`); the launcher reads it as often as it would ask the API, with the same parser.
"""

import argparse
import json
import os
from typing import Callable, List, Mapping, Optional, Union

from .errors import LaunchError
from .hosts import Host

__all__ = ["KUBERNETES", "add_arguments", "ready_pod_hosts", "PodDiscovery", "PodListFile", "from_args"]

KUBERNETES = "kubernetes"
SELECTOR_ENV = "HVDPLUS_POD_SELECTOR"
NAMESPACE_ENV = "HVDPLUS_POD_NAMESPACE"
# Where Kubernetes puts the pod's own namespace, beside its service account's token.
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def add_arguments(group) -> None:
    """--host-discovery and the pod flags, in hvdplusrun's elastic group."""
    group.add_argument("--host-discovery", choices=[KUBERNETES],
                       help="find the hosts without a script: 'kubernetes', the Ready pods that --pod-selector picks")
    group.add_argument("--pod-selector", default=os.environ.get(SELECTOR_ENV), metavar="LABELS",
                       help=f"label selector of the job's pods, e.g. app=train (default: ${SELECTOR_ENV})")
    group.add_argument("--pod-namespace", default=os.environ.get(NAMESPACE_ENV), metavar="NAMESPACE",
                       help=f"their namespace (default: ${NAMESPACE_ENV}, else this pod's own)")
    group.add_argument("--slots-per-pod", type=int, default=1, metavar="N", help="ranks per pod (default: 1)")
    group.add_argument("--pod-list-file", action=_PodListFileAction, metavar="FILE",
                       help="read the pods from FILE, a pod list as `kubectl get pods -o json` prints it, "
                            "instead of the API (implies --host-discovery kubernetes)")


class _PodListFileAction(argparse.Action):
    """--pod-list-file alone selects the pods' discovery: without it, the file would go unread."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.host_discovery = KUBERNETES


def _is_ready(pod: Mapping) -> bool:
    status = pod.get("status", {})
    return status.get("phase") == "Running" and any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions", []))


def _host_name(pod: Mapping) -> Optional[str]:
    spec = pod.get("spec", {})
    if spec.get("hostname") and spec.get("subdomain"):
        return f"{spec['hostname']}.{spec['subdomain']}"
    return pod.get("status", {}).get("podIP")


def ready_pod_hosts(pod_list: Mapping, slots: int) -> List[Host]:
    """The hosts of a pod list as the Kubernetes API returns it (`kubectl get pods -o json`):
    the pods that are Ready and not being deleted, in the order of their names.

    Args:
        pod_list: the API's PodList, decoded from its JSON.
        slots: ranks per pod.
    """
    pods = sorted(pod_list.get("items", []), key=lambda pod: pod["metadata"]["name"])
    names = [_host_name(pod) for pod in pods if _is_ready(pod) and not pod["metadata"].get("deletionTimestamp")]
    return [Host(name, slots) for name in names if name]


def _in_cluster_pod_list(namespace: str, selector: str) -> Mapping:
    """The pod list through the API server, with this pod's service account."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise LaunchError("--host-discovery kubernetes needs the Kubernetes client: "
                          'pip install "hvdplus[kubernetes]"') from None
    config.load_incluster_config()
    # The response's own JSON, as kubectl prints it, rather than the client's objects.
    response = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    return json.loads(response.data)


class PodDiscovery:
    """The launcher's HostDiscovery for `--host-discovery kubernetes`.

    Args:
        namespace: the pods' namespace.
        selector: the label selector of the job's pods.
        slots: ranks per pod.
        list_pods: (namespace, selector) -> the API's PodList (by default, through the API server).
    """

    def __init__(self, namespace: str, selector: str, slots: int,
                 list_pods: Callable[[str, str], Mapping] = _in_cluster_pod_list):
        self.namespace, self.selector, self.slots = namespace, selector, slots
        self._list_pods = list_pods

    def hosts(self) -> List[Host]:
        try:
            pod_list = self._list_pods(self.namespace, self.selector)
        except LaunchError:
            raise
        except Exception as error:  # the client's errors: no API server, no permission
            raise LaunchError(f"listing the pods {self.selector!r} in namespace {self.namespace!r} failed: "
                              f"{error}") from None
        return ready_pod_hosts(pod_list, self.slots)


class PodListFile:
    """The launcher's HostDiscovery for --pod-list-file: the Ready pods of the pod list in a file.

    Args:
        path: the file, replaced whole (written aside, then renamed) each time it changes, so that
            a reader never sees half of it.
        slots: ranks per pod.
    """

    def __init__(self, path: str, slots: int):
        self.path, self.slots = path, slots

    def hosts(self) -> List[Host]:
        try:
            with open(self.path) as file:
                pod_list = json.load(file)
        except OSError as error:
            raise LaunchError(f"--pod-list-file {self.path}: {error.strerror}") from None
        except ValueError as error:
            raise LaunchError(f"--pod-list-file {self.path} is not JSON: {error}") from None
        if not isinstance(pod_list, dict) or not isinstance(pod_list.get("items"), list):
            raise LaunchError(f"--pod-list-file {self.path} holds no pod list: no 'items' list, as "
                              "`kubectl get pods -o json` prints")
        return ready_pod_hosts(pod_list, self.slots)


def from_args(args: argparse.Namespace) -> Union[PodListFile, PodDiscovery]:
    """The discovery that hvdplusrun's flags describe."""
    if args.pod_list_file:
        return PodListFile(args.pod_list_file, args.slots_per_pod)
    if not args.pod_selector:
        raise LaunchError(f"--host-discovery kubernetes needs --pod-selector or ${SELECTOR_ENV}")
    namespace = args.pod_namespace
    if not namespace:
        try:
            with open(NAMESPACE_FILE) as file:
                namespace = file.read().strip()
        except OSError:
            raise LaunchError(f"--host-discovery kubernetes needs --pod-namespace or ${NAMESPACE_ENV} outside a pod") \
                from None
    return PodDiscovery(namespace, args.pod_selector, args.slots_per_pod)
