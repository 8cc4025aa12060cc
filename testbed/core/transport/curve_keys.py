"""CurveZMQ key pairs of the lab: one for the aggregator, one per edge device.

Layout written by :func:`generate_keys` (and by ``testbed keys --out DIR --devices N``)::

    DIR/aggregator.key            public certificate of the aggregator
    DIR/aggregator.key_secret     its secret certificate (mode 0600)
    DIR/device-{i}.key            public certificate of device i (metadata ``device = i``)
    DIR/device-{i}.key_secret     its secret certificate (mode 0600)
    DIR/allowed/device-{i}.key    allow-list: the device public certificates, nothing else

The files use the ZeroMQ certificate format that :func:`zmq.auth.load_certificate` and
:class:`zmq.auth.thread.ThreadAuthenticator` read. They are written here rather than by
:func:`zmq.auth.create_certificates` because that function puts the metadata only into
the *secret* certificate, overwrites existing files and leaves the secret file with the
process umask; here the public certificate carries ``device = i`` (the allow-list binds a
key to a device id), every file is created atomically and never replaces an existing one,
and secret files are mode 0600.

The aggregator host needs ``aggregator.key``, ``aggregator.key_secret`` and ``allowed/``;
the host of device i needs ``device-{i}.key``, ``device-{i}.key_secret`` and
``aggregator.key``. No host but the aggregator needs another host's secret.
"""

from __future__ import annotations

import datetime
import os
import stat
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testbed.core.runs.durable import fsync_dir

#: Largest number of devices one key set holds.
MAX_DEVICES = 10_000
#: File name suffixes of public and secret certificates (the czmq / pyzmq convention).
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
#: Directory, inside the keys directory, of the allow-list of device public certificates.
ALLOWED_DIRNAME = "allowed"
AGGREGATOR_NAME = "aggregator"
#: What to run when key files are missing or unusable.
KEYS_HINT = "create keys with `testbed keys --out DIR --devices N` and copy them to this host"

#: Length of a z85-encoded 32-byte CURVE key.
Z85_KEY_CHARS = 40
#: A certificate is a few hundred bytes; anything far larger is not one.
_MAX_CERT_BYTES = 64 * 1024

_PUBLIC_BANNER = """#   ****  Generated on {now} by testbed keys  ****
#   ZeroMQ CURVE Public Certificate
#   Holds no secret. Copy it to the hosts that must recognise this key.

"""
_SECRET_BANNER = """#   ****  Generated on {now} by testbed keys  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

"""


class KeyFileMissingError(FileNotFoundError):
    """A key file or the allow-list directory does not exist."""


class KeyFileError(ValueError):
    """A key file exists but cannot be used (unreadable, malformed, unsafe permissions)."""


@dataclass(frozen=True)
class KeySet:
    """Paths of a lab key set (see the module docstring for the layout).

    Attributes
    ----------
    out_dir : Path
        Keys directory.
    aggregator_public, aggregator_secret : Path
        Certificates of the aggregator.
    allowed_dir : Path
        Allow-list directory (device public certificates only).
    device_public, device_secret : tuple of Path
        Certificates of device i at index i.
    allowed_public : tuple of Path
        Allow-list copy of ``device_public[i]`` at index i.
    """

    out_dir: Path
    aggregator_public: Path
    aggregator_secret: Path
    allowed_dir: Path
    device_public: tuple[Path, ...]
    device_secret: tuple[Path, ...]
    allowed_public: tuple[Path, ...]

    @classmethod
    def layout(cls, out_dir: Path, devices: int) -> KeySet:
        """The paths of a key set of ``devices`` devices in ``out_dir`` (nothing is read)."""
        check_devices(devices)
        out_dir = Path(out_dir)
        allowed = out_dir / ALLOWED_DIRNAME
        names = [device_name(i) for i in range(devices)]
        return cls(
            out_dir=out_dir,
            aggregator_public=out_dir / f"{AGGREGATOR_NAME}{PUBLIC_SUFFIX}",
            aggregator_secret=out_dir / f"{AGGREGATOR_NAME}{SECRET_SUFFIX}",
            allowed_dir=allowed,
            device_public=tuple(out_dir / f"{n}{PUBLIC_SUFFIX}" for n in names),
            device_secret=tuple(out_dir / f"{n}{SECRET_SUFFIX}" for n in names),
            allowed_public=tuple(allowed / f"{n}{PUBLIC_SUFFIX}" for n in names),
        )

    @property
    def devices(self) -> int:
        """Number of devices in the set."""
        return len(self.device_public)

    def files(self) -> tuple[Path, ...]:
        """Every file of the set (aggregator, devices, allow-list)."""
        return (
            self.aggregator_public,
            self.aggregator_secret,
            *self.device_public,
            *self.device_secret,
            *self.allowed_public,
        )

    def aggregator_host_files(self) -> tuple[Path, ...]:
        """What the aggregator host needs: its key pair and the allow-list directory."""
        return (self.aggregator_public, self.aggregator_secret, self.allowed_dir)

    def device_host_files(self, device: int) -> tuple[Path, ...]:
        """What the host of ``device`` needs: its key pair and the aggregator's public key."""
        if not 0 <= device < self.devices:
            raise ValueError(f"device: got {device}; allowed: 0 <= device < {self.devices}")
        return (self.device_public[device], self.device_secret[device], self.aggregator_public)


def device_name(device: int) -> str:
    """Base file name of the certificates of ``device`` (``device-{i}``)."""
    return f"device-{device}"


def check_devices(devices: object) -> int:
    """``devices`` if it is an int in 1..MAX_DEVICES, else ValueError naming it."""
    if isinstance(devices, bool) or not isinstance(devices, int) or not (
        1 <= devices <= MAX_DEVICES
    ):
        raise ValueError(
            f"devices: got {devices!r}; allowed: an integer with 1 <= devices <= {MAX_DEVICES}"
        )
    return devices


# --------------------------------------------------------------------------- writing


def _certificate_text(
    banner: str, public_z85: bytes, secret_z85: bytes | None, metadata: dict[str, str]
) -> bytes:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [banner.format(now=now), "metadata\n"]
    lines += [f"    {key} = {value}\n" for key, value in metadata.items()]
    lines += ["curve\n", f'    public-key = "{public_z85.decode("ascii")}"\n']
    if secret_z85 is not None:
        lines.append(f'    secret-key = "{secret_z85.decode("ascii")}"\n')
    return "".join(lines).encode("ascii")


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` holding ``data`` atomically; never replace an existing file.

    The data go to a temporary file in the same directory (created 0600 by mkstemp, so a
    secret is never readable by others, not even briefly), are fsynced, get ``mode`` and
    are hard-linked to ``path``; ``link`` fails if ``path`` exists, unlike ``rename``.
    """
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ValueError(f"{path}: already exists; key files are never overwritten") from None
        except OSError:
            # File systems without hard links: check, then rename (a small race remains).
            if path.exists() or path.is_symlink():
                raise ValueError(
                    f"{path}: already exists; key files are never overwritten"
                ) from None
            os.rename(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def generate_keys(out_dir: Path, devices: int) -> KeySet:
    """Write the aggregator's and ``devices`` devices' CurveZMQ key pairs to ``out_dir``.

    Parameters
    ----------
    out_dir : Path
        Keys directory; created (mode 0700) if missing. It must not hold any of the files
        of the set, and ``out_dir/allowed`` must be missing or empty.
    devices : int
        Number of edge devices, 1..MAX_DEVICES; they get ids 0..devices-1.

    Returns
    -------
    KeySet
        Paths of what was written.

    Raises
    ------
    ValueError
        ``devices`` out of range, or ``out_dir`` already holds keys (nothing is written).
        If writing fails part way, the files written by this call are removed again.
    """
    keys = KeySet.layout(Path(out_dir), devices)
    out = keys.out_dir
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir '{out}': exists and is not a directory")
    existing = [p for p in keys.files() if p.exists() or p.is_symlink()]
    if existing:
        shown = ", ".join(p.name for p in existing[:3])
        more = f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        raise ValueError(
            f"out_dir '{out}': already holds key files ({shown}{more}); keys are never "
            "overwritten; allowed: a new or empty directory"
        )
    if keys.allowed_dir.is_dir() and any(keys.allowed_dir.iterdir()):
        raise ValueError(
            f"out_dir '{out}': '{keys.allowed_dir}' is not empty; a stale certificate there "
            "would be allowed in; allowed: a new or empty directory"
        )
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys.allowed_dir.mkdir(mode=0o755, exist_ok=True)

    created: list[Path] = []

    def pair(public_path: Path, secret_path: Path, metadata: dict[str, str]) -> bytes:
        import zmq  # on use, here and below: not every command that imports this needs it

        public_z85, secret_z85 = zmq.curve_keypair()
        public_text = _certificate_text(_PUBLIC_BANNER, public_z85, None, metadata)
        _write_new_file(public_path, public_text, 0o644)
        created.append(public_path)
        secret_text = _certificate_text(_SECRET_BANNER, public_z85, secret_z85, metadata)
        _write_new_file(secret_path, secret_text, 0o600)
        created.append(secret_path)
        return public_text

    try:
        pair(keys.aggregator_public, keys.aggregator_secret, {"role": AGGREGATOR_NAME})
        for i in range(keys.devices):
            meta = {"role": "device", "device": str(i)}
            public_text = pair(keys.device_public[i], keys.device_secret[i], meta)
            _write_new_file(keys.allowed_public[i], public_text, 0o644)
            created.append(keys.allowed_public[i])
    except BaseException:
        for path in created:
            path.unlink(missing_ok=True)
        raise
    fsync_dir(keys.allowed_dir)
    fsync_dir(out)
    return keys


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Certificate:
    """A parsed certificate file.

    Attributes
    ----------
    path : Path
        Where it was read from.
    public_key : bytes
        z85-encoded public key (40 ASCII bytes).
    secret_key : bytes or None
        z85-encoded secret key, None in a public certificate.
    metadata : dict of str to str
        The ``metadata`` section (``role``, ``device``).
    """

    path: Path
    public_key: bytes
    secret_key: bytes | None
    metadata: dict[str, str]


def _missing(path: Path, what: str) -> KeyFileMissingError:
    return KeyFileMissingError(f"{path}: {what} not found; {KEYS_HINT}")


def _check_z85_key(path: Path, name: str, value: str) -> bytes:
    from zmq.utils import z85

    raw = value.encode("ascii") if value.isascii() else b""
    try:
        decoded = z85.decode(raw) if len(raw) == Z85_KEY_CHARS else b""
    except (ValueError, KeyError, struct.error):
        decoded = b""
    if len(decoded) != 32:
        raise KeyFileError(
            f"{path}: {name} is not a 40-character z85 CURVE key; {KEYS_HINT}"
        )
    return raw


def read_certificate(path: Path) -> Certificate:
    """Parse one certificate file (the ZeroMQ certificate text format).

    Raises
    ------
    KeyFileMissingError
        ``path`` does not exist.
    KeyFileError
        It cannot be read, is not a certificate, or holds a malformed key.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_CERT_BYTES + 1)
    except FileNotFoundError:
        raise _missing(path, "key file") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read ({exc.strerror}); {KEYS_HINT}") from None
    if len(data) > _MAX_CERT_BYTES:
        raise KeyFileError(f"{path}: larger than {_MAX_CERT_BYTES} bytes; not a certificate")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: not a text certificate; {KEYS_HINT}") from None
    section = ""
    metadata: dict[str, str] = {}
    curve: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not line[0].isspace():
            section = stripped
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise KeyFileError(f"{path}:{lineno}: expected 'name = value'; {KEYS_HINT}")
        value = value.strip().strip("\"'")
        if section == "metadata":
            metadata[key.strip()] = value
        elif section == "curve":
            curve[key.strip()] = value
    if "public-key" not in curve:
        raise KeyFileError(f"{path}: no public-key in a 'curve' section; {KEYS_HINT}")
    public = _check_z85_key(path, "public-key", curve["public-key"])
    secret = None
    if "secret-key" in curve:
        import zmq

        secret = _check_z85_key(path, "secret-key", curve["secret-key"])
        if zmq.curve_public(secret) != public:
            raise KeyFileError(f"{path}: public-key does not belong to secret-key; {KEYS_HINT}")
    return Certificate(path=path, public_key=public, secret_key=secret, metadata=metadata)


def _read_secret_certificate(path: Path) -> Certificate:
    """A secret certificate, refused if group or others may read it (as ssh does)."""
    cert = read_certificate(path)
    if cert.secret_key is None:
        raise KeyFileError(f"{path}: holds no secret-key; {KEYS_HINT}")
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise KeyFileError(
            f"{path}: secret key file has mode {mode:04o} (readable by others); "
            f"run `chmod 600 {path}`"
        )
    return cert


def _metadata_device(cert: Certificate) -> int:
    value = cert.metadata.get("device")
    if value is None or not value.isdigit() or not 0 <= int(value) < MAX_DEVICES:
        raise KeyFileError(
            f"{cert.path}: metadata 'device' is {value!r}; expected an integer device id "
            f"in 0..{MAX_DEVICES - 1}; {KEYS_HINT}"
        )
    return int(value)


def load_aggregator_keys(keys_dir: Path) -> tuple[bytes, bytes]:
    """The aggregator's ``(public, secret)`` z85 keys from ``keys_dir/aggregator.key_secret``."""
    cert = _read_secret_certificate(Path(keys_dir) / f"{AGGREGATOR_NAME}{SECRET_SUFFIX}")
    assert cert.secret_key is not None
    return cert.public_key, cert.secret_key


def load_device_keys(keys_dir: Path, device: int) -> tuple[bytes, bytes]:
    """Device ``device``'s ``(public, secret)`` z85 keys from ``device-{i}.key_secret``.

    The certificate's metadata must name the same device id.
    """
    if isinstance(device, bool) or not isinstance(device, int) or not (
        0 <= device < MAX_DEVICES
    ):
        raise ValueError(f"device: got {device!r}; allowed: an integer in 0..{MAX_DEVICES - 1}")
    cert = _read_secret_certificate(Path(keys_dir) / f"{device_name(device)}{SECRET_SUFFIX}")
    if _metadata_device(cert) != device:
        raise KeyFileError(
            f"{cert.path}: metadata says device {cert.metadata.get('device')}, not {device}"
        )
    assert cert.secret_key is not None
    return cert.public_key, cert.secret_key


def aggregator_public_key(keys_dir: Path) -> bytes:
    """The aggregator's z85 public key from ``keys_dir/aggregator.key`` (no secret read)."""
    return read_certificate(Path(keys_dir) / f"{AGGREGATOR_NAME}{PUBLIC_SUFFIX}").public_key


def load_allow_list(allowed_dir: Path) -> dict[bytes, int]:
    """The allow-list: z85 public key -> device id, from ``allowed_dir/*.key``.

    Reads the files the ZAP authenticator reads (``*.key``, not hidden). Each must be a
    public certificate with metadata ``device``.

    Raises
    ------
    KeyFileMissingError
        ``allowed_dir`` does not exist.
    KeyFileError
        A certificate is malformed or holds a secret key, a secret certificate lies in the
        directory, it holds no certificate, or two files carry the same key or device id
        (the message names both files).
    """
    allowed_dir = Path(allowed_dir)
    if not allowed_dir.is_dir():
        raise _missing(allowed_dir, "allow-list directory")
    by_key: dict[bytes, Certificate] = {}
    by_device: dict[int, Certificate] = {}
    for path in sorted(allowed_dir.iterdir()):
        if path.name.startswith("."):
            continue
        if path.name.endswith(SECRET_SUFFIX):
            raise KeyFileError(
                f"{path}: a secret certificate in the allow-list directory; remove it "
                "(the allow-list holds device public certificates only)"
            )
        if not path.name.endswith(PUBLIC_SUFFIX):
            continue
        cert = read_certificate(path)
        if cert.secret_key is not None:
            raise KeyFileError(
                f"{path}: holds a secret-key; the allow-list holds public certificates only"
            )
        device = _metadata_device(cert)
        if cert.public_key in by_key:
            raise KeyFileError(
                f"{by_key[cert.public_key].path} and {path}: the same public key twice"
            )
        if device in by_device:
            raise KeyFileError(f"{by_device[device].path} and {path}: both claim device {device}")
        by_key[cert.public_key] = cert
        by_device[device] = cert
    if not by_key:
        raise KeyFileError(f"{allowed_dir}: holds no device certificate (*.key); {KEYS_HINT}")
    return {key: _metadata_device(cert) for key, cert in by_key.items()}
