"""What every deployment-file check shares (cluster.yaml, the KubeRay manifest, the Slurm script, the
Dockerfile): the result record a check returns (:class:`ClusterCheck`) and the secret scan -- the one test of
whether a committed file, or a comment in it, holds a credential.

Pure text and YAML: no Ray, no sweep."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_LITERAL = r"['\"]?\s*[=:]\s*['\"]?(?=[^$'\"\s])"  # "=value", ": 'value'" (JSON), but not "=$VAR"
_SECRET_VAR = r"\b(WANDB_API_KEY|[A-Z][A-Z0-9_]*(?:_TOKEN|_SECRET|SECRET_ACCESS_KEY|_API_KEY|PASSWORD))"
_AWS_KEY_ID = (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key id")
_SECRET_PATTERNS = (
    _AWS_KEY_ID,
    (re.compile(_SECRET_VAR + _LITERAL, re.I), "a literal {0}"),
    # `wandb login KEY` (flags and a --host URL may come first); `wandb login $WANDB_API_KEY` reads the shell's
    (re.compile(r"\bwandb\s+login\b(?:\s+--?[A-Za-z][\w-]*(?:[= ](?![-$'\"])\S*[:/.]\S*|=\S*)?)*\s+['\"]?"
                r"(?![$-])[A-Za-z0-9_-]{20,}(?![^\s'\";&|)])"), "a W&B key given to `wandb login`"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\"private_key\"\s*:"), "a service-account private key"),
    # tokens by their published prefixes: Hugging Face (`hf_`), GitHub (classic `ghp_` and kin, fine-grained)
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"), "a GitHub token"),
    # `huggingface-cli login --token X` / `huggingface-cli login --token=X` (not `$HF_TOKEN`)
    (re.compile(r"\bhuggingface-cli\s+login\b[^\n;&|]*?--token[= ]+['\"]?(?![$'\"-])[^\s'\";&|]{8,}"),
     "a token given to `huggingface-cli login`"),
    # user:password@ in a URL (pip --index-url, git+https://...), not `$USER:$PASS@` or `${TOKEN}@`
    (re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@'\"$]+:(?![$])[^\s/@'\"$]+@", re.I), "a password in a URL"),
    # a netrc line (`machine api.wandb.ai login user password KEY`), however it is written into ~/.netrc
    (re.compile(r"\bmachine\s+\S+\s+login\s+\S+\s+password\s+(?![$'\"])[A-Za-z0-9_-]{16,}"),
     "a .netrc password"),
    (re.compile(r"\bAccountKey=(?![$])[A-Za-z0-9+/]{16,}", re.I), "an Azure storage account key"),
    (re.compile(r"\bSharedAccessSignature=(?![$])\S{16,}|[?&]sig=[A-Za-z0-9%+/]{20,}", re.I),
     "an Azure shared access signature"),
    # a W&B key is 40 hex characters; with W&B named before it on the line (a git commit hash is not)
    (re.compile(r"(?:wandb|w&b|weights\s*(?:&|and)\s*biases)[^\n]{0,60}?(?<![0-9a-f])[0-9a-f]{40}(?![0-9a-f])",
                re.I), "a W&B API key"),
    # any other name of a credential followed by a value shaped like a key (16+ key characters)
    (re.compile(r"(?<![A-Za-z0-9])((?:[A-Za-z0-9]+[_.-])*(?:api[_-]?key|secret[_-]?key|access[_-]?key|auth[_-]?token"
                r"|password|passwd))['\"]?\s*[=:]\s*['\"]?[A-Za-z0-9_+-]{16,}(?![\w.-])", re.I), "a literal {0}"),
)
# In comments, prose (`--from-file=WANDB_API_KEY=/path/to/file`, `WANDB_API_KEY=<your key>`) names variables
# without holding them: a variable counts there only with a value shaped like a key (16+ key characters)
_COMMENT_PATTERNS = (
    _AWS_KEY_ID,
    (re.compile(_SECRET_VAR + r"['\"]?\s*[=:]\s*['\"]?[A-Za-z0-9_+-]{16,}(?![\w/.+-])", re.I), "a literal {0}"),
    *_SECRET_PATTERNS[2:],
)
_SECRET_KEYS = re.compile(r"^(aws_secret_access_key|aws_session_token|secret_access_key|wandb_api_key|"
                          r"ray_auth_token|password|private_key|api_key|token)$", re.I)
# The name of a variable that holds a credential (an env entry's `name`, a Dockerfile ENV or ARG)
SECRET_NAME = re.compile(r"(WANDB_API_KEY|RAY_AUTH_TOKEN|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN|[A-Z0-9_]*"
                         r"(?:_TOKEN|_SECRET|_API_KEY|PASSWORD))$", re.I)
# Where `wandb login` keeps the key, or a file named for it: file_mounts would copy it to every node.
WANDB_KEY_FILE = re.compile(r"(^|/)\.?netrc$|wandb[^/]*key|key[^/]*wandb", re.I)
# Files that hold a private key or cloud credentials: an SSH key, AWS's credentials file, a PKCS#12 bundle
KEY_FILE = re.compile(r"(^|/)(id_(rsa|dsa|ecdsa|ed25519)(?!\.pub)(\b|$)|\.aws/credentials$|credentials\.json$|"
                      r"[^/]*\.(p12|pfx)$)", re.I)


@dataclass
class ClusterCheck:
    """``problems`` make the file unusable (``iclmem cluster-check`` exits 2); ``notes`` are what could not be
    checked offline."""

    path: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# ------------------------------------------------------------------------------------------- secrets
def _walk(value: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], Any, str]]:
    """(path, mapping key holding it or None, text) for every string in the document."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str):
                yield path + (k,), k, v
            else:
                yield from _walk(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, str):
                yield path + (i,), None, v
            else:
                yield from _walk(v, path + (i,))


def literal_secret(text: str, *, comment: bool = False) -> str | None:
    """What credential ``text`` holds ("a literal WANDB_API_KEY", "a private key", ...), or None: the one test
    of cluster files, sweeps, Dockerfiles and batch scripts. ``comment``: ``text`` is a comment, where a
    variable's name followed by a value counts only when the value is shaped like a key."""
    for pattern, what in _COMMENT_PATTERNS if comment else _SECRET_PATTERNS:
        match = pattern.search(text)
        if match:
            return what.format(*match.groups())
    return None


def _mappings(value: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[tuple[Any, ...], dict[Any, Any]]]:
    """(path, mapping) for every mapping in the document, the document itself included."""
    if isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from _mappings(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _mappings(v, path + (i,))


def secret_problems(config: dict[str, Any], where: str) -> list[str]:
    """A cluster or sweep file is committed and copied to every node: it must hold no credential."""
    problems = []
    advice = ("keep secrets out of the file: the cloud's credential chain, ~/.ray/auth_token, and for W&B a "
              "0600 file read on the head (docs/CLUSTER.md, W&B)")
    for path, key, text in _walk(config):
        at = ".".join(map(str, path))
        if isinstance(key, str) and _SECRET_KEYS.match(key) and text.strip() and not text.strip().startswith("$"):
            problems.append(f"{where}: {at}: holds a credential; {advice}")
            continue
        found = literal_secret(text)
        if found:
            problems.append(f"{where}: {at}: holds {found}; {advice}")
    for path, mapping in _mappings(config):  # an env entry {name: RAY_AUTH_TOKEN, value: <the token>}
        name, value = mapping.get("name"), mapping.get("value")
        if (isinstance(name, str) and SECRET_NAME.match(name) and isinstance(value, str) and value.strip()
                and not value.strip().startswith("$")):
            at = ".".join(map(str, path)) or "(top level)"
            problems.append(f"{where}: {at}: sets {name} to a literal value; take it from a Secret "
                            "(valueFrom.secretKeyRef) or a file read at run time")
    mounts = config.get("file_mounts")
    for remote, local in (mounts.items() if isinstance(mounts, dict) else []):
        if any(isinstance(p, str) and WANDB_KEY_FILE.search(p) for p in (remote, local)):
            problems.append(f"{where}: file_mounts.{remote}: copies a W&B key file to every node; only the driver "
                            "needs it: keep it in a 0600 file on the head (docs/CLUSTER.md, W&B)")
    return problems


def comment_secret_problems(text: str, where: str, *, whole_line_only: bool = False) -> list[str]:
    """Credentials in the comments of a file's text (``where:LINE``): every parser drops comments, git does not,
    so a key in one is committed with the file. ``whole_line_only``: only lines that start with ``#`` are
    comments (a Dockerfile, a shell script); otherwise also what follows `` #`` (YAML)."""
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip()
        if stripped.startswith("#"):
            comment = stripped[1:]
        elif whole_line_only or (match := re.search(r"\s#(.*)$", line)) is None:
            continue
        else:
            comment = match.group(1)
        found = literal_secret(comment, comment=True)
        if found:
            problems.append(f"{where}:{number}: a comment holds {found}; remove it and revoke the credential (the "
                            "file's history keeps it)")
    return problems
