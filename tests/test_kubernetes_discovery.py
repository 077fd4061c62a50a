"""`hvdplusrun --host-discovery kubernetes` (hvdplus.runner.kubernetes_discovery): the hosts
of an elastic job are the pods that are Ready and not terminating. No API server runs here, so
the parsing is checked on a pod list in the API's own JSON, as `kubectl get pods -o json` prints
it, written below; the transport is the official client's, checked to fail clearly outside a pod."""

import json

import pytest

from hvdplus.runner import kubernetes_discovery
from hvdplus.runner.errors import LaunchError
from hvdplus.runner.hosts import Host
from hvdplus.runner.launch import _is_elastic, parse_args


def pod(name, phase="Running", ready=True, deleting=False, subdomain="train", ip="10.0.0.9"):
    metadata = {"name": name, "namespace": "ml", "labels": {"app": "train"}, "uid": f"uid-{name}",
                "creationTimestamp": "2026-01-01T00:00:00Z"}
    if deleting:
        metadata.update(deletionTimestamp="2026-01-01T00:05:00Z", deletionGracePeriodSeconds=30)
    spec = {"containers": [{"name": "hvdplus", "image": "hvdplus:kubernetes"}], "restartPolicy": "Never"}
    if subdomain:
        spec.update(hostname=name, subdomain=subdomain)
    conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
                  {"type": "ContainersReady", "status": str(ready)}, {"type": "Ready", "status": str(ready)}]
    status = {"phase": phase, "conditions": conditions if phase == "Running" else conditions[:1]}
    if phase == "Running":
        status.update(podIP=ip, podIPs=[{"ip": ip}])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


POD_LIST = json.dumps({
    "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
    "items": [pod("train-2"), pod("train-0"), pod("train-1", ready=False), pod("train-3", deleting=True),
              pod("train-4", phase="Pending"), pod("train-5", subdomain=None, ip="10.0.0.7")],
}, indent=4)


def test_the_hosts_are_the_ready_pods_that_are_not_terminating_by_their_dns_names():
    hosts = kubernetes_discovery.ready_pod_hosts(json.loads(POD_LIST), slots=2)
    assert hosts == [Host("train-0.train", 2), Host("train-2.train", 2), Host("10.0.0.7", 2)]


def test_an_empty_pod_list_has_no_hosts():
    assert kubernetes_discovery.ready_pod_hosts({"apiVersion": "v1", "items": []}, slots=1) == []


def test_pod_discovery_lists_the_selected_pods_of_its_namespace():
    asked = []

    def list_pods(namespace, selector):
        asked.append((namespace, selector))
        return json.loads(POD_LIST)

    discovery = kubernetes_discovery.PodDiscovery("ml", "app=train", 1, list_pods=list_pods)
    assert [host.name for host in discovery.hosts()] == ["train-0.train", "train-2.train", "10.0.0.7"]
    assert asked == [("ml", "app=train")]


def test_outside_a_cluster_the_client_s_failure_is_a_launch_error():
    pytest.importorskip("kubernetes")
    discovery = kubernetes_discovery.PodDiscovery("ml", "app=train", 1)
    with pytest.raises(LaunchError, match="listing the pods 'app=train' in namespace 'ml' failed"):
        discovery.hosts()


def test_the_flags_make_an_elastic_job_with_pod_discovery(monkeypatch):
    args = parse_args(["--host-discovery", "kubernetes", "--pod-selector", "app=train", "--pod-namespace", "ml",
                       "--slots-per-pod", "4", "python", "train.py"])
    assert _is_elastic(args)
    discovery = kubernetes_discovery.from_args(args)
    assert (discovery.namespace, discovery.selector, discovery.slots) == ("ml", "app=train", 4)


def test_the_selector_and_namespace_come_from_the_downward_api_variables(monkeypatch):
    monkeypatch.setenv(kubernetes_discovery.SELECTOR_ENV, "job-name=train")
    monkeypatch.setenv(kubernetes_discovery.NAMESPACE_ENV, "team")
    discovery = kubernetes_discovery.from_args(parse_args(["--host-discovery", "kubernetes", "python", "t.py"]))
    assert (discovery.namespace, discovery.selector) == ("team", "job-name=train")


def test_pod_discovery_without_a_selector_says_what_is_missing(monkeypatch):
    monkeypatch.delenv(kubernetes_discovery.SELECTOR_ENV, raising=False)
    with pytest.raises(LaunchError, match="needs --pod-selector or \\$HVDPLUS_POD_SELECTOR"):
        kubernetes_discovery.from_args(parse_args(["--host-discovery", "kubernetes", "python", "t.py"]))


def test_a_pod_list_file_is_read_as_the_api_s_list_each_time(tmp_path):
    path = tmp_path / "pods.json"
    path.write_text(POD_LIST)
    args = parse_args(["--pod-list-file", str(path), "--slots-per-pod", "2", "python", "train.py"])
    assert _is_elastic(args), "--pod-list-file alone makes the job elastic, with the pods' discovery"
    discovery = kubernetes_discovery.from_args(args)
    assert discovery.hosts() == [Host("train-0.train", 2), Host("train-2.train", 2), Host("10.0.0.7", 2)]
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod("train-7")]}))
    assert discovery.hosts() == [Host("train-7.train", 2)]


@pytest.mark.parametrize("content, message", [
    (None, "pods.json: No such file or directory"),
    ('{"items": [', "pods.json is not JSON"),
    ('[{"kind": "Pod"}]', "pods.json holds no pod list: no 'items' list"),
])
def test_a_pod_list_file_that_holds_no_pod_list_is_a_launch_error_naming_it(tmp_path, content, message):
    path = tmp_path / "pods.json"
    if content is not None:
        path.write_text(content)
    discovery = kubernetes_discovery.from_args(parse_args(["--pod-list-file", str(path), "python", "t.py"]))
    with pytest.raises(LaunchError, match=message):
        discovery.hosts()
