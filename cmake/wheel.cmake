# The wheel that `pip install .` builds (scikit-build-core sets SKBUILD and the SKBUILD_*_DIR
# folders; pyproject.toml installs only the component `wheel`):
#   <platlib>/cocemu/            the package's Python files, cocemu.torch and the extension
#   <scripts>/cocemu             the CLI (the environment's bin/)
#   <data>/share/cocemu/         the configs (the environment's prefix/share/cocemu), where the CLI
#                                and the module find them (runtime/src/config_dir.cpp)
# Headers, libcocemu.so and the CMake and pkg-config packages are for C++ consumers: the
# `./bootstrap.sh install` route installs them.
if(NOT TARGET cocemu_python)
  message(FATAL_ERROR "pip install: the Python module cannot be built (see the messages above: "
                      "Python headers, NumPy or pybind11 missing)")
endif()
file(GLOB _cocemu_wheel_py ${PROJECT_SOURCE_DIR}/python/cocemu/*.py)
file(GLOB _cocemu_wheel_torch_py ${PROJECT_SOURCE_DIR}/python/cocemu/torch/*.py)
file(GLOB _cocemu_wheel_processes_py ${PROJECT_SOURCE_DIR}/python/cocemu/processes/*.py)
install(FILES ${_cocemu_wheel_py} DESTINATION ${SKBUILD_PLATLIB_DIR}/cocemu COMPONENT wheel)
install(FILES ${_cocemu_wheel_torch_py} DESTINATION ${SKBUILD_PLATLIB_DIR}/cocemu/torch
        COMPONENT wheel)
install(FILES ${_cocemu_wheel_processes_py} DESTINATION ${SKBUILD_PLATLIB_DIR}/cocemu/processes
        COMPONENT wheel)
install(TARGETS cocemu_python LIBRARY DESTINATION ${SKBUILD_PLATLIB_DIR}/cocemu COMPONENT wheel)
install(TARGETS cocemu RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR} COMPONENT wheel)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION ${SKBUILD_DATA_DIR}/share/cocemu
        COMPONENT wheel)
