"""Publishing a directory atomically: write beside the final path, then one rename.

``Staging`` reserves a hidden sibling (``.NAME.tmp-HOST-PID-xxxx``) that the writer fills.
``commit`` publishes it:

- **new** (``overwrite=False``): ``renameat2(RENAME_NOREPLACE)``: a directory that another writer
  created meanwhile is never replaced (the commit fails and says so);
- **replace** (``overwrite=True``): ``renameat2(RENAME_EXCHANGE)`` swaps the new directory and
  the old one in one step, so a crash at any moment leaves one complete copy under the path;
  the old copy is then removed from the hidden sibling.

Where the system has no ``renameat2`` (not Linux, or a filesystem without it), a replace is two
renames with the old copy parked in ``.NAME.old-HOST-PID-xxxx/replaced``: the next ``Staging`` of
the same path puts it back if a crash came between them. The hidden siblings of dead processes
on this host (their pid is in the name) are removed by the next export to the same place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pathlib
import shutil
import socket
import tempfile
from collections.abc import Iterator

from paramreg_jax._src import errors

_NOREPLACE, _EXCHANGE = 1, 2
_AT_FDCWD = -100
_LIBC = ctypes.CDLL(None, use_errno=True)


def renameat2(src: pathlib.Path, dst: pathlib.Path, flags: int) -> bool:
  """``renameat2(src, dst, flags)``; False where the system or filesystem lacks it."""
  fn = getattr(_LIBC, "renameat2", None)
  if fn is None:
    return False
  if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
    return True
  err = ctypes.get_errno()
  if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
    return False
  raise OSError(err, os.strerror(err), os.fspath(dst))


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class Staging:
  """A hidden directory beside ``final`` that becomes ``final`` in one rename.

  ``create=False`` reserves the name only (a writer that insists on creating its directory
  itself: orbax)."""

  def __init__(self, final: pathlib.Path, *, overwrite: bool, create: bool = True):
    self.final = final
    self.overwrite = overwrite
    self.tag = f"{socket.gethostname().replace('-', '_')}-{os.getpid()}"
    check_destination(final, overwrite)
    try:
      self._recover()
      self.dir = pathlib.Path(
        tempfile.mkdtemp(prefix=f".{final.name}.tmp-{self.tag}-", dir=final.parent)
      )
    except OSError as e:
      raise errors.ExportError(
        f"{final}: cannot write beside it ({e.strerror or e}); pick a writable path", str(final)
      ) from e
    if not create:
      self.dir.rmdir()

  def path(self, name: str) -> pathlib.Path:
    return self.dir / name

  def commit(self) -> None:
    """Publishes the staged directory (synced first); see the module docstring."""
    _sync_tree(self.dir)
    if not self.overwrite or not self.final.exists():
      try:
        if renameat2(self.dir, self.final, _NOREPLACE):
          return _sync_dir(self.final.parent)
      except FileExistsError:
        if not self.overwrite:
          raise _appeared(self.final) from None
      else:
        if not self.overwrite:
          return self._fallback_new()
    if renameat2(self.dir, self.final, _EXCHANGE):
      _sync_dir(self.final.parent)
      _remove(self.dir)  # the old copy (or the link that was there), swapped into our name
      return None
    return self._fallback_replace()

  def abort(self) -> None:
    """Removes the staged directory and whatever a writer staged under names derived from it
    (orbax's ``<name>.orbax-checkpoint-tmp-...``): everything named after the reservation."""
    _remove(self.dir)
    for other in self.final.parent.glob(f"{glob_escape(self.dir.name)}*"):
      _remove(other)

  def _fallback_new(self) -> None:
    try:
      os.mkdir(self.final)  # fails if it appeared: never replace another writer's directory
    except FileExistsError:
      raise _appeared(self.final) from None
    os.rmdir(self.final)
    os.rename(self.dir, self.final)
    _sync_dir(self.final.parent)

  def _fallback_replace(self) -> None:
    old = pathlib.Path(
      tempfile.mkdtemp(prefix=f".{self.final.name}.old-{self.tag}-", dir=self.final.parent)
    )
    if self.final.exists() or self.final.is_symlink():
      os.rename(self.final, old / "replaced")
    os.rename(self.dir, self.final)  # a crash before this: the next Staging puts the old back
    _sync_dir(self.final.parent)
    _remove(old / "replaced")
    _remove(old)

  def _recover(self) -> None:
    """Removes the hidden siblings of dead exports on this host; puts back an old copy that a
    crash left parked between the two renames of a fallback replace."""
    host = self.tag.split("-")[0]
    for stale in self.final.parent.glob(f".{self.final.name}.*-{host}-*"):
      parts = stale.name[len(self.final.name) + 2 :].split("-")
      if len(parts) < 4 or parts[0] not in ("tmp", "old") or not parts[2].isdigit():
        continue
      if _alive(int(parts[2])):
        continue
      parked = stale / "replaced"
      if parts[0] == "old" and parked.is_dir() and not self.final.exists():
        os.rename(parked, self.final)
      _remove(stale)


@contextlib.contextmanager
def published(staging: Staging, what: str) -> Iterator[Staging]:
  """Fill ``staging`` in the block; publish it when the block ends, or remove it on any
  failure. A failure that is not the library's becomes an ``ExportError`` that names the path
  and says what is left there (the old directory untouched, or nothing)."""
  try:
    yield staging
    staging.commit()
  except BaseException as e:
    staging.abort()
    if isinstance(e, errors.ParamRegError) or not isinstance(e, Exception):
      raise
    left = "the old one there is untouched" if staging.final.exists() else "nothing was written"
    raise errors.ExportError(
      f"{staging.final}: {what} failed: {type(e).__name__}: {e}; {left}", str(staging.final)
    ) from e


def existing_files(final: pathlib.Path) -> tuple[str, ...]:
  """What a replace of ``final`` removes: every file under it now (relative names)."""
  if not final.is_dir():
    return ()
  return tuple(sorted(str(p.relative_to(final)) for p in final.rglob("*") if p.is_file()))


def _remove(path: pathlib.Path) -> None:
  """Removes ``path``: a link itself (never what it points to), a file, or a tree."""
  if path.is_symlink() or path.is_file():
    with contextlib.suppress(FileNotFoundError):
      path.unlink()
  else:
    shutil.rmtree(path, ignore_errors=True)


def glob_escape(name: str) -> str:
  return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def check_destination(final: pathlib.Path, overwrite: bool) -> None:
  """Refuses a destination that cannot be written (named, with the fix) before any work."""
  if final.is_symlink() and not final.exists():
    raise errors.ExportError(
      f"{final} is a symbolic link to {os.readlink(final)}, which does not exist; remove the "
      "link, or export to the directory it should point to",
      str(final),
    )
  if final.exists() and not overwrite:
    raise errors.ExportError(
      f"{final} already exists; export writes a new directory (overwrite=True, or "
      "--overwrite on the command line, replaces it)",
      str(final),
    )
  if final.exists() and not final.is_dir():
    raise errors.ExportError(f"{final} is a file, not a checkpoint directory; pick another path")
  blocker = next((p for p in (final, *final.parents) if p.exists() and not p.is_dir()), None)
  if blocker is not None:
    raise errors.ExportError(
      f"{final}: {blocker} is a file, so nothing can be written under it; pick another path",
      str(final),
    )
  try:
    final.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise errors.ExportError(
      f"{final}: cannot create its parent directory ({e.strerror or e}); pick a writable path",
      str(final),
    ) from e
  if not os.access(final.parent, os.W_OK | os.X_OK):
    raise errors.ExportError(
      f"{final}: {final.parent} is not writable (read-only filesystem or permissions); pick a "
      "writable path",
      str(final),
    )


def _appeared(final: pathlib.Path) -> errors.ExportError:
  return errors.ExportError(
    f"{final} appeared while this export was being written (another writer?); nothing was "
    "replaced and nothing of this export was kept (overwrite=True replaces it)",
    str(final),
  )


def _sync_tree(root: pathlib.Path) -> None:
  for child in root.rglob("*"):
    if child.is_file():
      fd = os.open(child, os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)


def _sync_dir(path: pathlib.Path) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)
