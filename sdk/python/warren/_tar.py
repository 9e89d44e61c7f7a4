"""Tar helpers for ``files.upload_dir`` / ``files.download_dir``."""

import io
import os
import tarfile
from typing import Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]


def pack_dir(local_dir: PathLike) -> Tuple[bytes, int]:
    """Pack the contents of ``local_dir`` (not the directory itself) into an
    uncompressed tar; returns (tar bytes, number of regular files)."""
    root = os.fspath(local_dir)
    if not os.path.isdir(root):
        raise NotADirectoryError(root)
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            if rel_dir != ".":
                tf.add(dirpath, arcname=rel_dir.replace(os.sep, "/"), recursive=False)
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                arc = os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")
                info = tf.gettarinfo(full, arcname=arc)
                if info.isreg():
                    with open(full, "rb") as f:
                        tf.addfile(info, f)
                    count += 1
                elif info.issym():
                    tf.addfile(info)
            # symlinks to directories are listed in dirnames but not followed
            for name in list(dirnames):
                full = os.path.join(dirpath, name)
                if os.path.islink(full):
                    arc = os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")
                    tf.addfile(tf.gettarinfo(full, arcname=arc))
                    dirnames.remove(name)
        end = tf.offset  # where the end-of-archive marker starts
    # Drop tarfile's padding to a 10 KiB record after the two zero blocks: the
    # archive stays valid and extractors that stop at the marker see no junk.
    return buf.getvalue()[:end + 2 * tarfile.BLOCKSIZE], count


def _safe(member: tarfile.TarInfo, dest: str) -> bool:
    name = member.name
    if name.startswith("/") or ".." in name.replace("\\", "/").split("/"):
        return False
    target = os.path.realpath(os.path.join(dest, name))
    if target != dest and not target.startswith(dest + os.sep):
        return False
    if member.issym() or member.islnk():
        link = member.linkname
        base = os.path.dirname(target) if member.issym() else dest
        resolved = os.path.realpath(os.path.join(base, link))
        if os.path.isabs(link) or (resolved != dest and not resolved.startswith(dest + os.sep)):
            return False
    return member.isreg() or member.isdir() or member.issym() or member.islnk()


def unpack(data: Union[bytes, "io.BufferedIOBase"], local_dir: PathLike) -> int:
    """Extract a tar into ``local_dir`` (created if needed), refusing members
    that would land outside it and device files. Returns the number of regular
    files written."""
    dest = os.path.realpath(os.fspath(local_dir))
    os.makedirs(dest, exist_ok=True)
    fileobj = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    count = 0
    with tarfile.open(fileobj=fileobj, mode="r|*") as tf:
        for member in tf:
            while member.name.startswith("./"):
                member.name = member.name[2:]
            member.name = member.name.rstrip("/")
            if member.name in ("", "."):
                continue
            if not _safe(member, dest):
                continue
            member.mode &= 0o7777
            member.uid = member.gid = os.getuid() if hasattr(os, "getuid") else 0
            member.uname = member.gname = ""
            if hasattr(tarfile, "data_filter"):
                tf.extract(member, dest, set_attrs=True, filter="fully_trusted")
            else:
                tf.extract(member, dest, set_attrs=True)
            if member.isreg():
                count += 1
    return count
