"""Import first, before any radixserve kernel: Triton kernels then run under the interpreter on
CPU tensors (TRITON_INTERPRET=1 is read when a kernel module is imported), and kernel modules an
earlier test module imported in compiled mode are dropped so that they are imported again."""
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
for _name in [m for m in sys.modules if m.startswith("radixserve.kernels.") and m != "radixserve.kernels.cpu_native"]:
    del sys.modules[_name]
