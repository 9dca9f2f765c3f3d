"""Builds the tally package with tally_pb2 and tally_pb2_grpc generated from ../proto/tally.proto
(protoc with grpc_python_plugin), or copied from TALLY_PROTO_DIR / ../build/python when a CMake build
already made them. Metadata is in pyproject.toml."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ("tally_pb2.py", "tally_pb2_grpc.py")


def generate(out_dir):
    for candidate in (os.environ.get("TALLY_PROTO_DIR"), os.path.join(HERE, "..", "build", "python")):
        if candidate and all(os.path.exists(os.path.join(candidate, m)) for m in MODULES):
            for m in MODULES:
                shutil.copy(os.path.join(candidate, m), os.path.join(out_dir, m))
            return
    proto_dir = os.path.join(HERE, "..", "proto")
    plugin = shutil.which("grpc_python_plugin")
    protoc = shutil.which("protoc")
    if not (plugin and protoc and os.path.exists(os.path.join(proto_dir, "tally.proto"))):
        raise RuntimeError("building tally needs ../proto/tally.proto, protoc and grpc_python_plugin "
                           "(Debian: protobuf-compiler-grpc), or TALLY_PROTO_DIR with tally_pb2*.py")
    subprocess.run([protoc, f"--proto_path={proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                    f"--plugin=protoc-gen-grpc_python={plugin}", os.path.join(proto_dir, "tally.proto")], check=True)


class BuildWithProto(build_py):
    def run(self):
        # The generated modules go straight into the build tree (top-level modules, as
        # tally/client.py imports them), then build_py copies the package as usual.
        os.makedirs(self.build_lib, exist_ok=True)
        generate(self.build_lib)
        super().run()


setup(cmdclass={"build_py": BuildWithProto})
