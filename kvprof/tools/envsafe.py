"""The environment a profiled child process gets: an allowlist, never the user's whole one.

Nsight Systems stores every environment variable of the process it profiles in its
report (and in the SQLite export). A shared report would share the user's tokens and
cloud keys, and a ``.nsys-rep`` cannot be rewritten afterwards, so the child never gets
those variables. ``child_environment`` builds that environment from the rules below;
everything else is dropped unless named on purpose with ``--pass-env NAME``. (nsys also
reads other processes' environments from /proc: ``kvprof.tools.nsys`` runs it in its
own PID namespace for that; the allowlist is the other half.)

Rules, in order (all in this module, nowhere else):

1. ``ALWAYS_PASS``: NVIDIA's multicast-off switches pass whenever set (the device
   machines require them; values are 0/1).
2. ``EXACT_NAMES``: what Python, CUDA, nsys and the locale need to run (PATH, PYTHONPATH,
   LD_LIBRARY_PATH, CUDA_VISIBLE_DEVICES, HOME, TMPDIR, LANG, LANGUAGE) and
   ``KVPROF_VARIABLES``, kvprof's own variables. ``KVPROF_*`` is *not* a prefix: any
   other KVPROF_ name (the tests plant ``KVPROF_TEST_SECRET``) is dropped.
3. ``ALLOWED_PREFIXES``: settings of CUDA, NCCL, torch, Triton and the locale (LC_*),
   each dropped anyway when ``looks_secret(name, value)``: a name such as
   ``TORCH_HUB_TOKEN`` or a value shaped like a credential is not a setting.
4. ``pass_env``: exact names the user asked for. Passed as given, even if they look
   secret (with a warning saying the report will hold them); a name that is not set is
   a warning, not an error.

``allowed(name, value)`` is rules 1-3 alone: ``kvprof.tools.scrub`` cuts the environment an
export holds down to it, so a scrubbed export shows what a profiled child would have been given.

LANG/LANGUAGE/LC_* pass because they decide how the child and nsys decode and print
text (file names, error messages); their values are locale names, not personal data.
PYTORCH_* passes with TORCH_*: ``PYTORCH_CUDA_ALLOC_CONF`` changes what is measured.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from kvprof.core.errors import Setting, UsageError, Words

log = logging.getLogger("kvprof")

PASS_ENV = Setting("pass_env")  # the setting that passes a variable on purpose (capture, nsys)

# kvprof's own variables: the only KVPROF_* names a child receives.
KVPROF_VARIABLES: tuple[str, ...] = ("KVPROF_NSYS", "KVPROF_CHILD", "KVPROF_RUN_SPEC", "KVPROF_CACHE_DIR",
                                     "KVPROF_SGL_CUBIN",  # where sgl_kernel_cubin's kernels are
                                     # the engine plugins' switches (kvprof.integrations.sglang, .vllm)
                                     "KVPROF_SGLANG", "KVPROF_SGLANG_WRITER", "KVPROF_SGLANG_DIR",
                                     "KVPROF_SGLANG_SHADOW",
                                     "KVPROF_VLLM", "KVPROF_VLLM_WRITER", "KVPROF_VLLM_DIR", "KVPROF_VLLM_SHADOW")

EXACT_NAMES: tuple[str, ...] = (
    "PATH",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "HOME",
    "TMPDIR",
    "LANG",
    "LANGUAGE",
    *KVPROF_VARIABLES,
)

ALLOWED_PREFIXES: tuple[str, ...] = ("CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "TRITON_", "LC_")

# Multicast off (NVLink SHARP): must reach every process of a multi-GPU run.
ALWAYS_PASS: tuple[str, ...] = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")

# A name is secret when one of its _-separated words is one of these ...
_SECRET_WORDS = frozenset(
    {
        "TOKEN", "TOKENS", "SECRET", "SECRETS", "KEY", "KEYS", "APIKEY", "PASS", "PASSWORD",
        "PASSWD", "PASSPHRASE", "PAT", "AUTH", "CREDENTIAL", "CREDENTIALS", "CREDS",
        "COOKIE", "PRIVATE", "SIGNATURE",
    }
)
# ... or it ends with one of these (HFTOKEN, MYSECRET).
_SECRET_ENDINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_KNOWN_TOKEN = re.compile(
    r"(?:hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|sk-|sk_live_|rk_live_|xox[abprs]-"
    r"|AKIA|ASIA|AIza|ya29\.|eyJ)[A-Za-z0-9_\-.=+/]{8,}"
)
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]+:[^/\s@]+@")
_OPAQUE = re.compile(r"[A-Za-z0-9+/=_\-.~]{20,}\Z")
_HEX = re.compile(r"[0-9A-Fa-f]+")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_DEVICE_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Fa-f\-]+\Z")


def is_secret_name(name: str) -> bool:
    """True for names that say they hold a credential (HF_TOKEN, AWS_SECRET_ACCESS_KEY)."""
    upper = name.upper()
    return bool(_SECRET_WORDS.intersection(upper.split("_"))) or upper.endswith(_SECRET_ENDINGS)


def _entropy(value: str) -> float:
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _random_word(word: str) -> bool:
    digits = any(c.isdigit() for c in word)
    if len(word) >= 32 and _HEX.fullmatch(word):  # a hash or key in hex
        return digits and any(c.isalpha() for c in word)
    upper, lower = any(c.isupper() for c in word), any(c.islower() for c in word)
    return (upper or lower) and (digits or (upper and lower)) and _entropy(word) >= 3.0


def looks_like_token(value: str) -> bool:
    """True for values shaped like a credential: a known token format, a URL with a
    password, or a random-looking word of 20+ characters (base64 included; a path counts
    only through a mixed-case random-looking segment of 16+). Not a GPU UUID. Errs towards True: a
    dropped setting is named in a warning and can be passed with --pass-env; a leaked
    token cannot be taken back."""
    if _KNOWN_TOKEN.search(value) or _URL_WITH_PASSWORD.search(value):
        return True
    if not _OPAQUE.match(value) or _DEVICE_UUID.match(value):
        return False
    if (value[0] not in "/.~" or _BASE64.fullmatch(value) and len(value) % 4 == 0) and _random_word(value):
        return True  # a path does not look like padded base64; base64 may start with /
    return any(  # a path: only a mixed-case random segment (base64 that starts with /)
        len(seg) >= 16 and _random_word(seg) and not seg.islower() and not seg.isupper()
        for seg in value.split("/")[1:]
    )


def looks_secret(name: str, value: str) -> bool:
    """Whether a variable must not reach a report even under an allowed prefix."""
    return is_secret_name(name) or looks_like_token(value)


def sensitive_values(env: Mapping[str, str] | None = None, min_length: int = 6) -> dict[str, str]:
    """name -> value of the variables in ``env`` whose value must not appear in any output.

    Used by ``scrub``: every string containing one of these values is removed. Values
    shorter than ``min_length`` are left out (``1``, ``true`` would match everywhere).
    """
    env = os.environ if env is None else env
    return {
        name: value
        for name, value in env.items()
        if len(value) >= min_length and looks_secret(name, value)
    }


def allowed(name: str, value: str) -> bool:
    """Rules 1-3 of the module docstring: whether a variable may reach a profiled child (and so
    stay in a scrubbed export, which ``kvprof.tools.scrub`` cuts down to the same list)."""
    if name in ALWAYS_PASS or name in EXACT_NAMES:
        return True
    return name.startswith(ALLOWED_PREFIXES) and not looks_secret(name, value)


def allowed_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) cut down to rules 1-3, quietly: the
    environment of an auxiliary nsys run (its export), where nothing is passed on purpose."""
    base = os.environ if base is None else base
    return {name: value for name, value in base.items() if allowed(name, value)}


def _allowed(name: str, value: str, names: Callable[[str], str]) -> bool:
    if allowed(name, value):
        return True
    if name.startswith(ALLOWED_PREFIXES):
        log.warning(Words("not passing %s to the profiled process: it looks like a secret (", PASS_ENV,
                          " %s passes it on purpose)").render(names), name, name)
    return False


def child_environment(
    base: Mapping[str, str] | None = None, pass_env: Sequence[str] = (), names: Callable[[str], str] = str
) -> dict[str, str]:
    """The explicit environment for a child that capture starts (rules: module docstring);
    ``names``: how its warnings spell the setting that passes a variable on purpose."""
    base = os.environ if base is None else base
    env = {name: value for name, value in base.items() if _allowed(name, value, names)}
    for name in pass_env:
        if not _NAME.match(name):
            raise UsageError(PASS_ENV, f" {name!r}: give an exact variable name (letters, digits, _)")
        if name not in base:
            log.warning(Words(PASS_ENV, " %s: not set in this environment, nothing passed").render(names), name)
            continue
        if looks_secret(name, base[name]):
            log.warning(Words(PASS_ENV, " %s looks like a secret: the .nsys-rep will hold its value "
                              "(scrub cleans exports, not .nsys-rep files)").render(names), name)
        env[name] = base[name]
    return env


def describe(env: Mapping[str, str]) -> list[str]:
    """The names (never the values) of an environment, sorted, for the run manifest."""
    return sorted(env)
