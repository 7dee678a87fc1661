"""scripts/atomic_write.py's rule for a sticky folder (/tmp): only the file's owner, the folder's
or root may replace a file there. Prints one word per case for the test to match."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import atomic_write  # noqa: E402

STICKY, PLAIN = 0o41777, 0o40777
cases = [
    atomic_write.may_replace_in(STICKY, 0, 1000, 1001),  # another user's file in /tmp: refused
    atomic_write.may_replace_in(STICKY, 0, 1000, 1000),  # one's own
    atomic_write.may_replace_in(STICKY, 1001, 1000, 1001),  # the folder's owner
    atomic_write.may_replace_in(STICKY, 5, 1000, 0),  # root
    atomic_write.may_replace_in(PLAIN, 0, 1000, 1001),  # not sticky: the folder's write bit decides
]
print(" ".join("yes" if case else "no" for case in cases))
