"""The pickles of a run directory (``rewards.pkl``, ``function.pkl``): what nbtrain trusts before loading.

Loading a pickle runs code. A run directory can be reached by anyone who can name it (``get_run`` takes a
path, resume follows the registry), so a pickle is loaded only when the user loading it owns it and nobody
else can change it: the file is owned by this user, is a regular file (not a link), and neither it (group
or others) nor its folder (others) is writable by anyone else. nbtrain writes its pickles with mode 0600.
The check is made on the open file, so the bytes read are the ones checked.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nbtrain.contract.errors import NbtrainError

WHY = "loading a pickle runs its code, so nbtrain loads one only when you own it and nobody else can write it"


class UntrustedPickle(NbtrainError):
    """A run directory's pickle that nbtrain refuses to load (the message says why and what to do)."""


def _open_checked(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if path.is_symlink():
            raise UntrustedPickle(f"not loading {path}: it is a symbolic link; {WHY}") from None
        raise UntrustedPickle(f"cannot read {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        me = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPickle(f"not loading {path}: it is not a regular file; {WHY}")
        if st.st_uid != me:
            raise UntrustedPickle(
                f"not loading {path}: it is owned by uid {st.st_uid}, not by you (uid {me}); {WHY}. To train "
                f"on someone else's run, start it again from its config (config.yaml) in your own runs"
            )
        if st.st_mode & 0o022:
            raise UntrustedPickle(
                f"not loading {path}: it is writable by others (mode {stat.S_IMODE(st.st_mode):o}); {WHY}. "
                f"If you wrote it and nobody else touched it: chmod go-w {path}"
            )
        folder = path.parent
        fst = os.stat(folder)
        if fst.st_mode & 0o002:
            raise UntrustedPickle(
                f"not loading {path}: its folder {folder} is writable by others (mode "
                f"{stat.S_IMODE(fst.st_mode):o}), who could have replaced it; {WHY}. If nobody else "
                f"touched it: chmod o-w {folder}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_trusted(path: str | Path) -> None:
    """Raise ``UntrustedPickle`` unless ``path`` is a pickle nbtrain may load (see the module)."""
    os.close(_open_checked(Path(path)))


def read_trusted(path: str | Path) -> bytes:
    """The bytes of the pickle at ``path``, checked as ``check_trusted`` does; ``UntrustedPickle`` if not."""
    fd = _open_checked(Path(path))
    with os.fdopen(fd, "rb") as f:
        return f.read()


def write_private(path: str | Path, data: bytes) -> None:
    """Write a pickle as nbtrain loads it back: a new file, mode 0600 whatever the umask."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)


__all__ = ["UntrustedPickle", "check_trusted", "read_trusted", "write_private"]
