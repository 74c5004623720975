"""Removing everything a run wrote, in a way the run cannot defeat.

The walk is iterative (a tree thousands of levels deep cannot exhaust the stack), works relative to
directory fds (no path grows past PATH_MAX), keeps one directory fd open at a time (no fd limit), and
makes each directory it enters writable first (mode 000 does not stop it). Every file belongs to the
run's uid, which the server shares, so nothing the run could do to permissions is out of its reach.
Whatever still fails is reported: the host then retires the worker instead of reusing it.
"""

import os
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _listing(fd):
    """(name, is_dir) of every entry of the directory open at ``fd``."""
    with os.scandir(fd) as entries:
        return [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]


def empty_directory(fd, problems):
    """Remove everything inside the directory open at ``fd`` (which stays open)."""
    fd = os.dup(fd)
    stack = [_listing(fd)]
    try:
        while stack:
            entries = stack[-1]
            if not entries:
                stack.pop()
                if stack:  # back up to the parent and remove the directory just emptied
                    parent = os.open("..", DIR_FLAGS, dir_fd=fd)
                    os.close(fd)
                    fd = parent
                    name, _ = stack[-1].pop()
                    _try(os.rmdir, name, fd, problems)
                continue
            name, is_dir = entries[-1]
            if not is_dir:
                entries.pop()
                _try(os.unlink, name, fd, problems)
                continue
            try:
                os.rmdir(name, dir_fd=fd)  # the common case, an empty directory
                entries.pop()
                continue
            except OSError:
                pass
            try:
                os.chmod(name, stat.S_IRWXU, dir_fd=fd)
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
                stack.append(_listing(child))
            except OSError as exc:
                entries.pop()
                problems.append(f"cannot enter {name!r}: {exc}")
                continue
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def _try(remove, name, dir_fd, problems):
    try:
        remove(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        problems.append(f"cannot remove {name!r}: {exc}")


def wipe(directory, keep=()):
    """Empty ``directory`` except the ``keep`` paths (read-only binds such as an interpreter under /tmp) and
    the directories leading to them. Returns a list of what could not be removed (empty when clean)."""
    problems = []
    try:
        fd = os.open(directory, DIR_FLAGS)
    except PermissionError:  # a scratch directory of our own (rlimits mode) that the run made mode 000
        try:
            os.chmod(directory, stat.S_IRWXU)
            fd = os.open(directory, DIR_FLAGS)
        except OSError as exc:
            return [f"cannot open {directory}: {exc}"]
    except OSError as exc:
        return [f"cannot open {directory}: {exc}"]
    try:
        if not any(k.startswith(directory + "/") for k in keep):
            empty_directory(fd, problems)
            return problems
        for name, is_dir in _listing(fd):
            path = os.path.join(directory, name)
            if path in keep:
                continue
            if any(k.startswith(path + "/") for k in keep):
                problems += wipe(path, keep)
            elif not is_dir:
                _try(os.unlink, name, fd, problems)
            else:
                try:
                    os.chmod(name, stat.S_IRWXU, dir_fd=fd)
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    problems.append(f"cannot enter {path}: {exc}")
                    continue
                try:
                    empty_directory(child, problems)
                finally:
                    os.close(child)
                _try(os.rmdir, name, fd, problems)
    finally:
        os.close(fd)
    return problems
