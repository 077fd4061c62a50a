"""Host discovery for elastic test jobs: a script that prints what a file holds, so that a test
(or the job itself) changes the slots the launcher finds by writing that file."""

__all__ = ["discovery_script"]


def discovery_script(folder, slots):
    """(hosts file, discovery script) in `folder`; the file starts as 'localhost:SLOTS'."""
    hosts = folder / "hosts"
    hosts.write_text(f"localhost:{slots}\n")
    script = folder / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    return hosts, script
