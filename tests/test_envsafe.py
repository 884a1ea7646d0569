"""The child environment is an allowlist: secrets never reach a profiled process."""

from __future__ import annotations

import base64
import logging
import random
import secrets

import pytest
from hypothesis import given, settings, strategies as st

from kvprof.core.errors import UsageError
from kvprof.tools import envsafe
from kvprof.tools.envsafe import child_environment, describe, looks_like_token, sensitive_values

PLANTED = "KVPROF_TEST_SECRET"


def _base() -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": "/work/main",
        "LD_LIBRARY_PATH": "/work/main/.gpu/lib",
        "CUDA_VISIBLE_DEVICES": "GPU-5e2c1c4a-8f6d-11ee-8c90-0242ac120002",
        "CUDA_MODULE_LOADING": "LAZY",
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1",
        "TORCH_CUDA_ARCH_LIST": "9.0",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TRITON_CACHE_DIR": "/home/alice/.triton/cache",
        "HOME": "/home/alice",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "KVPROF_NSYS": "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys",
        "KVPROF_CHILD": "1",
        "KVPROF_RUN_SPEC": "/tmp/run/spec.json",
        "KVPROF_CACHE_DIR": "/tmp/kvprof",
        PLANTED: secrets.token_hex(16),
        "HF_TOKEN": "hf_" + secrets.token_urlsafe(24),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "OPENAI_API_KEY": "sk-" + secrets.token_urlsafe(30),
        "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
        "USER": "alice",
        "SHELL": "/bin/bash",
        "LD_PRELOAD": "/lib/evil.so",
        "TORCH_HUB_TOKEN": "abc",  # secret by name under an allowed prefix
        "TRITON_REMOTE_CACHE": secrets.token_urlsafe(30),  # secret by value
        "NCCL_PROXY_URL": "https://bob:hunter2@proxy.example:8080",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


def test_allowlist_keeps_what_the_child_needs() -> None:
    env = child_environment(_base())
    assert describe(env) == sorted(
        [
            "CUDA_MODULE_LOADING", "CUDA_VISIBLE_DEVICES", "HOME", "KVPROF_CACHE_DIR", "KVPROF_CHILD",
            "KVPROF_NSYS", "KVPROF_RUN_SPEC", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "NCCL_DEBUG",
            "NCCL_IB_HCA", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS", "PATH", "PYTHONPATH",
            "PYTORCH_CUDA_ALLOC_CONF", "TMPDIR", "TORCH_CUDA_ARCH_LIST", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "TRITON_CACHE_DIR",
        ]
    )
    assert env["CUDA_VISIBLE_DEVICES"] == _base()["CUDA_VISIBLE_DEVICES"]


def test_planted_and_known_secrets_never_pass(caplog: pytest.LogCaptureFixture) -> None:
    base = _base()
    with caplog.at_level(logging.WARNING, logger="kvprof"):
        env = child_environment(base)
    secret_names = [PLANTED, "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "TORCH_HUB_TOKEN",
                    "TRITON_REMOTE_CACHE", "NCCL_PROXY_URL"]
    for name in secret_names:
        assert name not in env
    joined = "\n".join(f"{k}={v}" for k, v in env.items())
    for name in secret_names:
        assert base[name] not in joined
    # dropped prefix-matched secrets are named (never their values) in a warning
    for name in ("TORCH_HUB_TOKEN", "TRITON_REMOTE_CACHE", "NCCL_PROXY_URL"):
        assert name in caplog.text
    assert base["TRITON_REMOTE_CACHE"] not in caplog.text


def test_kvprof_prefix_is_not_blanket_allowed() -> None:
    env = child_environment({"KVPROF_SOMETHING_NEW": "x", "KVPROF_NSYS": "/x/nsys"})
    assert env == {"KVPROF_NSYS": "/x/nsys"}
    assert set(envsafe.KVPROF_VARIABLES) == {"KVPROF_NSYS", "KVPROF_CHILD", "KVPROF_RUN_SPEC", "KVPROF_CACHE_DIR",
                                             "KVPROF_SGL_CUBIN", "KVPROF_SGLANG", "KVPROF_SGLANG_WRITER",
                                             "KVPROF_SGLANG_DIR", "KVPROF_SGLANG_SHADOW", "KVPROF_VLLM",
                                             "KVPROF_VLLM_WRITER", "KVPROF_VLLM_DIR", "KVPROF_VLLM_SHADOW"}
    # each engine's variables pass to the processes kvprof starts, its shadow check's included
    assert child_environment({"KVPROF_SGLANG_SHADOW": "100", "KVPROF_VLLM_SHADOW": "10"}) == \
        {"KVPROF_SGLANG_SHADOW": "100", "KVPROF_VLLM_SHADOW": "10"}


def test_multicast_switches_always_pass_when_set() -> None:
    env = child_environment({"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"})
    assert env == {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}
    assert child_environment({}) == {}


def test_pass_env_adds_on_purpose(caplog: pytest.LogCaptureFixture) -> None:
    base = _base()
    with caplog.at_level(logging.WARNING, logger="kvprof"):
        env = child_environment(base, pass_env=["USER", "HF_TOKEN", "NOT_SET_ANYWHERE"])
    assert env["USER"] == "alice" and env["HF_TOKEN"] == base["HF_TOKEN"]
    assert "NOT_SET_ANYWHERE" not in env
    assert "NOT_SET_ANYWHERE: not set" in caplog.text
    assert "HF_TOKEN looks like a secret" in caplog.text
    assert base["HF_TOKEN"] not in caplog.text


@pytest.mark.parametrize("bad", ["HF_*", "A B", "", "X=1"])
def test_pass_env_takes_exact_names(bad: str) -> None:
    with pytest.raises(UsageError):
        child_environment({}, pass_env=[bad])


def test_defaults_to_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    value = secrets.token_hex(16)
    monkeypatch.setenv(PLANTED, value)
    monkeypatch.setenv("CUDA_MODULE_LOADING", "LAZY")
    env = child_environment()
    assert PLANTED not in env and env["CUDA_MODULE_LOADING"] == "LAZY"
    assert sensitive_values()[PLANTED] == value


def test_sensitive_values_skip_short_and_plain() -> None:
    found = sensitive_values({"API_KEY": "1", "HF_TOKEN": "hf_abcdefghijkl", "PATH": "/usr/bin"})
    assert found == {"HF_TOKEN": "hf_abcdefghijkl"}


@pytest.mark.parametrize(
    "value",
    ["9.0", "LAZY", "expandable_segments:True", "/home/alice/.cache/triton", "mlx5_0:1,mlx5_1:1",
     "GPU-5e2c1c4a-8f6d-11ee-8c90-0242ac120002", "+dynamo,guards", "0,1,2,3", "PCI_BUS_ID",
     "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys", "/usr/local/cuda-12.4/lib64"],
)
def test_settings_are_not_tokens(value: str) -> None:
    assert not looks_like_token(value)


@settings(derandomize=True, max_examples=300)  # a property of random strings: no flaky seeds
@given(st.integers(0, 2**32), st.integers(16, 40))
def test_random_tokens_are_tokens(seed: int, n: int) -> None:
    raw = random.Random(seed).randbytes(n)  # a real token is random; hypothesis bytes are not
    assert looks_like_token(raw.hex())
    assert looks_like_token(base64.b64encode(raw).decode())
    assert looks_like_token(base64.urlsafe_b64encode(raw).decode().rstrip("="))
