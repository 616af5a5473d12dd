"""Kernel conformance: jupyter_kernel_test's KernelTests pass through the relay as they do
for a plain ipykernel, with the same samples.

The same sample set runs against the installed control kernel and against the plain
``python3`` kernel, so a difference between the two is a failure of the relay.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import pytest

jupyter_kernel_test = pytest.importorskip("jupyter_kernel_test")

from test_control_kernel import hk_folders, kernelspecs


class _Samples:
    """What ipykernel's own conformance tests use, as far as jupyter_kernel_test checks them."""

    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples: ClassVar[list[dict[str, Any]]] = [
        {"text": "zi", "matches": {"zip"}},
    ]
    complete_code_samples: ClassVar[list[str]] = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples: ClassVar[list[str]] = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples: ClassVar[list[str]] = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('relayed')"
    code_execute_result: ClassVar[list[dict[str, str]]] = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data: ClassVar[list[dict[str, str]]] = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
         "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))",
         "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


class TestControlKernel(_Samples, jupyter_kernel_test.KernelTests):
    """The installed control kernel: a Host in front of ipykernel."""

    kernel_name = "host_kernel"
    _stack: ClassVar[contextlib.ExitStack]
    _tmp: ClassVar[Path]

    @classmethod
    def setUpClass(cls) -> None:
        cls._stack = contextlib.ExitStack()
        root = Path(cls._stack.enter_context(tempfile.TemporaryDirectory(prefix="hkconf-")))
        cls._tmp = root / "tmp"
        cls._tmp.mkdir()
        (root / "ws").mkdir()
        cls._stack.enter_context(kernelspecs(root))
        mp = cls._stack.enter_context(pytest.MonkeyPatch.context())
        mp.setenv("TMPDIR", str(cls._tmp))
        mp.chdir(root / "ws")  # the relay's workspace and record: its working directory
        try:
            super().setUpClass()
        except BaseException:
            cls._stack.close()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            super().tearDownClass()
            cls.km.cleanup_resources()
            assert hk_folders(cls._tmp) == [], "the relay left its runtime folder behind"
        finally:
            cls._stack.close()


class TestPlainIpykernel(_Samples, jupyter_kernel_test.KernelTests):
    """The baseline: the same samples against a plain ipykernel."""

    kernel_name = "python3"

    @classmethod
    def setUpClass(cls) -> None:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
            super().setUpClass()


class TestControlKernelWelcome(jupyter_kernel_test.IopubWelcomeTests):
    """The relay greets a new iopub subscriber as ipykernel 7 does (iopub_welcome)."""

    kernel_name = "host_kernel"
    support_iopub_welcome = True
    _stack: ClassVar[contextlib.ExitStack]

    @classmethod
    def setUpClass(cls) -> None:
        cls._stack = contextlib.ExitStack()
        root = Path(cls._stack.enter_context(tempfile.TemporaryDirectory(prefix="hkconf-")))
        cls._stack.enter_context(kernelspecs(root))
        mp = cls._stack.enter_context(pytest.MonkeyPatch.context())
        mp.chdir(root)
        try:
            super().setUpClass()
        except BaseException:
            cls._stack.close()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            super().tearDownClass()
        finally:
            cls._stack.close()

