"""Child processes, the lowest layer (no torch import): ``child.py`` is the child side
(``setup_child``: logging, signals, the parent-death watchdog), ``supervisor.py`` the parent
side (one ``Supervisor`` starts, watches and stops named children; the HTTP launcher, a
node's tensor-parallel launcher and the in-process Engine's TP group use it),
``stop_signals.py`` a launcher's own SIGINT/SIGTERM, and ``stages.py`` the start-up stages'
log lines (a line as each starts and ends, progress while it runs), written by every process.

Shutdown, in short: signals to the whole process group reach only the launcher (children
ignore SIGINT/SIGTERM/SIGHUP); the launcher's first SIGINT/SIGTERM starts the orderly stop,
later ones are ignored; the supervisor stops the children in the launcher's order, each with
a bounded grace, then SIGKILL; children die with their parent.
"""
from radixserve.proc.child import (IGNORED_SIGNALS, STOP_SIGNAL, configure_logging, on_stop, set_process_name,
                                   setup_child, start_parent_watchdog)
from radixserve.proc.stop_signals import StopSignals
from radixserve.proc.supervisor import STOP_GRACE_S, ChildDied, ChildExit, Supervisor

__all__ = ["IGNORED_SIGNALS", "STOP_GRACE_S", "STOP_SIGNAL", "ChildDied", "ChildExit", "StopSignals", "Supervisor",
           "configure_logging", "on_stop", "set_process_name", "setup_child", "start_parent_watchdog"]
