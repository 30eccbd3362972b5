import subprocess

import pytest

from trtllm_entrypoint.config.gpu import Gpu, GpuInfo, Visibility, detect_gpus, parse_nvidia_smi, require_gpus, visible
from trtllm_entrypoint.errors import EntrypointError

# The line observed on an H200 host (reference/gpu-detection.md), and a 4-GPU host with UUIDs.
H200 = "0, NVIDIA H200, 9.0, 143771 MiB, 580.159.04\n"
FOUR = "".join(f"{i}, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB, 550.54.15, GPU-000{i}-aaaa\n" for i in range(4))


def test_parse_the_observed_h200_line():
    info = parse_nvidia_smi(H200)
    assert info.gpus == (Gpu(index=0, name="NVIDIA H200", compute_capability="9.0", memory_mib=143771),)
    assert (info.count, info.names, info.compute_capability, info.driver) == (1, ("NVIDIA H200",), "9.0", "580.159.04")


def test_parse_with_uuid_column_and_blank_lines():
    info = parse_nvidia_smi("\n" + FOUR + "\n")
    assert [g.index for g in info.gpus] == [0, 1, 2, 3]
    assert info.gpus[2].uuid == "GPU-0002-aaaa"
    assert info.gpus[0].memory_mib == 81559


def test_parse_unknown_memory_and_empty_output():
    assert parse_nvidia_smi("0, NVIDIA A10G, 8.6, [N/A], 535.1\n").gpus[0].memory_mib == 0
    empty = parse_nvidia_smi("")
    assert (empty.count, empty.driver, empty.compute_capability) == (0, None, None)


@pytest.mark.parametrize("text", ["garbage", "0, NVIDIA H200, 9.0", "x, NVIDIA H200, 9.0, 1 MiB, 1.0"])
def test_parse_rejects_unexpected_lines(text):
    with pytest.raises(EntrypointError, match="could not parse this nvidia-smi line"):
        parse_nvidia_smi(text)


def test_mixed_compute_capabilities_are_refused():
    info = parse_nvidia_smi("0, NVIDIA H100, 9.0, 1 MiB, 550\n1, NVIDIA L40S, 8.9, 1 MiB, 550\n")
    with pytest.raises(EntrypointError, match=r"different compute capabilities \(8.9, 9.0\)") as err:
        _ = info.compute_capability
    assert "CUDA_VISIBLE_DEVICES" in err.value.hint


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, [2, 0]),
        ({"CUDA_VISIBLE_DEVICES": "1,7,2"}, [1]),  # CUDA stops at the first unknown entry
        ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "GPU-0003"}, [3]),  # unique UUID prefix
        ({"CUDA_VISIBLE_DEVICES": "GPU-000"}, []),  # ambiguous prefix names no device
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, [0, 1, 2, 3]),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": ""}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "1,3"}, [1, 3]),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-0002-aaaa"}, [2]),
        ({"NVIDIA_VISIBLE_DEVICES": "4,5"}, [0, 1, 2, 3]),  # host indices the runtime already applied
        ({"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}, [0, 1, 2, 3]),
        ({"NVIDIA_VISIBLE_DEVICES": "1,2,3", "CUDA_VISIBLE_DEVICES": "3,1"}, [3, 1]),
        ({"NVIDIA_VISIBLE_DEVICES": "1,2", "CUDA_VISIBLE_DEVICES": "0"}, []),
        ({"CUDA_VISIBLE_DEVICES": "²"}, []),  # str.isdigit() is true, int() fails: names no device
        ({"NVIDIA_VISIBLE_DEVICES": "1,²"}, [0, 1, 2, 3]),
    ],
)
def test_visible_devices_filtering(env, expected):
    given = Visibility(env.get("NVIDIA_VISIBLE_DEVICES"), env.get("CUDA_VISIBLE_DEVICES"))
    info = visible(parse_nvidia_smi(FOUR), given)
    assert [g.index for g in info.gpus] == expected
    assert info.driver == "550.54.15"


class FakeRun:
    """Stands in for subprocess.run; records the argv and keyword arguments it was given."""

    def __init__(self, stdout="", returncode=0, raises=None):
        self.stdout, self.returncode, self.raises = stdout, returncode, raises
        self.calls = []

    def __call__(self, argv, **kwargs):
        self.calls.append((argv, kwargs))
        if self.raises:
            raise self.raises
        return subprocess.CompletedProcess(argv, self.returncode, stdout=self.stdout, stderr="")


def test_detect_runs_nvidia_smi_with_a_timeout_and_applies_visibility():
    run = FakeRun(stdout=FOUR)
    info = detect_gpus(Visibility(cuda="1"), run=run)
    assert [g.index for g in info.gpus] == [1]
    argv, kwargs = run.calls[0]
    assert argv == [
        "nvidia-smi",
        "--query-gpu=index,name,compute_cap,memory.total,driver_version,uuid",
        "--format=csv,noheader",
    ]
    assert kwargs == {"capture_output": True, "text": True, "timeout": 20, "check": False}


@pytest.mark.parametrize(
    "run",
    [
        FakeRun(raises=FileNotFoundError("nvidia-smi")),
        FakeRun(stdout="No devices were found\n", returncode=6),
        FakeRun(stdout="No devices were found\n", returncode=0),
        FakeRun(stdout="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", returncode=9),
    ],
)
def test_detect_without_gpus(run):
    assert detect_gpus(Visibility(), run=run) == GpuInfo(gpus=(), driver=None)


def test_detect_timeout_is_an_error():
    run = FakeRun(raises=subprocess.TimeoutExpired(["nvidia-smi"], 20))
    with pytest.raises(EntrypointError, match="did not answer within 20 s"):
        detect_gpus(Visibility(), run=run)


def test_require_gpus():
    info = parse_nvidia_smi(H200)
    require_gpus(info, 1, "TP_SIZE=1")
    with pytest.raises(EntrypointError) as err:
        require_gpus(info, 2, "TP_SIZE=2 x PP_SIZE=1")
    assert err.value.message == "TP_SIZE=2 x PP_SIZE=1 needs 2 GPUs, but 1 GPU is visible"
    assert "--gpus all" in err.value.hint
    with pytest.raises(EntrypointError, match="needs 1 GPU, but 0 GPUs are visible"):
        require_gpus(GpuInfo(gpus=(), driver=None), 1, "building an engine")
