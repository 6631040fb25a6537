# SPDX-License-Identifier: Apache-2.0
"""The site's HPK settings (/etc/podnet/hpk.yaml, written by the collection when
`podnet_hpk_enabled`) and a user's state directory."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import stat
from pathlib import Path
from typing import Any

import yaml

SITE_CONFIG = Path("/etc/podnet/hpk.yaml")


class SettingsError(Exception):
    """A setting or a state directory podnet-hpk cannot use (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    # {user} and {home} are replaced; the directory must be on a file system that the login
    # nodes and the compute nodes share (a home directory, a parallel file system)
    state_dir: str = "{home}/.podnet-hpk"
    # where `image: NAME[:TAG]` is looked up: NAME_TAG.sif, NAME.sif (TAG latest), NAME/
    image_dirs: tuple[str, ...] = ("{state}/images", "/opt/podnet/hpk/images")
    bin_dir: str = "/usr/local/lib/podnet/hpk"
    apptainer: str = "/usr/bin/apptainer"
    # hostPath volumes are bound only under these prefixes (none by default)
    host_path_prefixes: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"
    # Services' ClusterIPs: bookkeeping only (no kube-proxy: Service names resolve to the
    # pods' podnet addresses, docs/hpk.md)
    service_cidr: str = "10.96.0.0/24"
    control_plane_time: str = "08:00:00"
    control_plane_cpus: int = 2
    # extra sbatch options of every job podnet-hpk submits (a partition, an account)
    sbatch_args: tuple[str, ...] = ()

    @classmethod
    def load(cls, path: Path = SITE_CONFIG, missing_ok: bool = True) -> Settings:
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            if not missing_ok:
                raise SettingsError(f"{path}: no such file") from None
            return cls()
        except (OSError, yaml.YAMLError) as e:
            raise SettingsError(f"{path}: {e}") from e
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: Any, where: str = "settings") -> Settings:
        if not isinstance(raw, dict):
            raise SettingsError(f"{where}: a mapping is expected")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        out: dict[str, Any] = {}
        for key, given in raw.items():
            value = given
            if key not in fields:
                raise SettingsError(
                    f"{where}: unknown setting {key!r} (known: {', '.join(sorted(fields))})"
                )
            default = fields[key].default
            if isinstance(default, tuple):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise SettingsError(f"{where}: {key} must be a list of strings")
                value = tuple(value)
            elif isinstance(default, bool) or not isinstance(value, type(default)):
                raise SettingsError(f"{where}: {key} must be a {type(default).__name__}")
            out[key] = value
        return cls(**out)

    def binary(self, name: str) -> str:
        """A program of the control plane: bin_dir's, else the one on PATH."""
        p = Path(self.bin_dir) / name
        if os.access(p, os.X_OK):
            return str(p)
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
            c = Path(d or ".") / name
            if os.access(c, os.X_OK) and c.is_file():
                return str(c)
        raise SettingsError(
            f"{name} not found in {self.bin_dir} nor on PATH: is HPK enabled on this cluster "
            "(podnet_hpk_enabled)? Ask your administrators."
        )


def user_state_dir(settings: Settings, uid: int | None = None, create: bool = True) -> Path:
    """The user's state directory: made 0700 if missing; refused unless the user owns it
    and nobody else can write it (a directory another user made for us is not ours)."""
    pw = pwd.getpwuid(os.getuid() if uid is None else uid)
    path = Path(settings.state_dir.format(user=pw.pw_name, home=pw.pw_dir)).expanduser()
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise SettingsError(f"{path}: not a directory")
    if st.st_uid != pw.pw_uid:
        raise SettingsError(f"{path}: owned by uid {st.st_uid}, not by {pw.pw_name}: remove it")
    if st.st_mode & 0o022:
        raise SettingsError(
            f"{path}: writable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 0700 it"
        )
    return path
