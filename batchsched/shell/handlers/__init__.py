"""The watch cache's handlers, one module per kind of object: each turns a
listed object into its cache entry, takes a whole list at once, and applies
one watch event (``*_entry``, ``_replace_*``, ``_apply_*``), reporting an
object it cannot use.  Parts of :class:`batchsched.shell.cache.ClusterCache`."""

# A refused object's reason goes into its status condition and an Event:
# kept short whatever the object (hostile keys are echoed in the reason).
MAX_PROBLEM_LENGTH = 2000
