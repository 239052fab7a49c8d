"""Every gang source, one line each: adding one is its module (names in
``gangsources/__init__.py``, its reader, status writer and RBAC needs as a
:class:`~batchsched.core.gangsources.plugin.GangSourcePlugin`) and its line
here.  The shell reads PodGroups and owners, and writes statuses, through
this table only."""
from __future__ import annotations

from typing import Mapping

from batchsched.core.gangsources import jobs, jobsets, native, own, schedulerplugins, stated_size, volcano
from batchsched.core.gangsources.plugin import GangSourcePlugin

PLUGINS: Mapping[str, GangSourcePlugin] = {plugin.source.name: plugin for plugin in (
    own.PLUGIN,
    native.PLUGIN,
    schedulerplugins.PLUGIN,
    volcano.PLUGIN,
    stated_size.KUEUE_PLUGIN,
    stated_size.LEADER_WORKER_SET_PLUGIN,
    jobsets.PLUGIN,
    jobs.PLUGIN,
)}
