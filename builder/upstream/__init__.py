"""Upstream releases: what is newer than a stack's pins (outdated), a new stack from a release's
own requirements (propose), and two stacks side by side (diff)."""
