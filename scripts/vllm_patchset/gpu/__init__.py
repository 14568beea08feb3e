"""GPU validation: red/green trees (`validate.py`, run by `gpurun.py`), the offline bundle
(`bundle.py`), the native-ops kit (`kitbuild.py` writes it, `kitparts.py` is its format and
its host side). `gpurun.py` and `kitparts.py` travel alone to GPU hosts (standard library only).

The names of what the GPU commands write are here, so that the command line names them in its
help without importing the modules that do the work.
"""

BUNDLE_NAME = "vllm-patchset-gpu"  # the bundle's folder, and its archive's name
KIT_NAME = "vllm-patchset-kit"  # a kit's folder: `kit build`'s, and beside a bundle's archive
KIT_PLATFORM = "manylinux_2_28_x86_64"  # the platform tag of the pin's wheel in a kit
KIT_PART_MIB = 60  # a kit part's largest size (kitparts.PART_LIMIT): `kit build --part-mib`
