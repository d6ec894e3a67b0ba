"""The owner label and the orphan reaper, now on the ground floor (builder/engine/owner.py);
this name stays for the modules of verify/ that still import it from here (smoke.py)."""

from builder.engine.owner import OWNER_LABEL, STOPPED, Orphan, dead_owner, owner, reap_orphans

__all__ = ["OWNER_LABEL", "STOPPED", "Orphan", "dead_owner", "owner", "reap_orphans"]
