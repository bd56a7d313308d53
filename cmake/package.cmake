# The installable package: headers, one shared library (libcocemu.so, the six libraries' objects;
# CMake target cocemu::cocemu), the `cocemu` CLI, the configs under <prefix>/share/cocemu, a CMake
# package config and a pkg-config file. `cmake --install build --prefix P` (or
# `./bootstrap.sh install P`) lays them out; installed programs and libraries find the configs
# relative to their own location (runtime/src/config_dir.cpp).
#
# The build tree's programs (the CLI, the tests, the Python module) link the static libraries;
# consumers get one shared library whose private dependencies (yaml-cpp, OpenBLAS's pthread
# variant with its rpath, oneTBB) are its own, so their link line is `-lcocemu`.
include(CMakePackageConfigHelpers)

set(_cocemu_libs cocemu_runtime cocemu_collectives cocemu_attention cocemu_layers cocemu_train
                 cocemu_bench)
set(_cocemu_objects)
foreach(lib IN LISTS _cocemu_libs)
  list(APPEND _cocemu_objects $<TARGET_OBJECTS:${lib}>)
endforeach()
add_library(cocemu_shared SHARED ${_cocemu_objects})
set_target_properties(cocemu_shared PROPERTIES
  OUTPUT_NAME cocemu EXPORT_NAME cocemu
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib)
target_include_directories(cocemu_shared PUBLIC
  "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/runtime/include;${PROJECT_SOURCE_DIR}/collectives/include;${PROJECT_SOURCE_DIR}/attention/include;${PROJECT_SOURCE_DIR}/layers/include;${PROJECT_SOURCE_DIR}/train/include;${PROJECT_SOURCE_DIR}/bench/include>"
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(cocemu_shared
  PUBLIC fmt::fmt Threads::Threads nlohmann_json::nlohmann_json
  PRIVATE yaml-cpp ${OPENBLAS_LIBRARY} TBB::tbb ${CMAKE_DL_LIBS})
# The headers are C++20 (std::bit_cast, std::span, concepts): a consumer gets the standard with the
# target, whatever its own CMAKE_CXX_STANDARD (tests/install builds one that sets none).
target_compile_features(cocemu_shared INTERFACE cxx_std_20)
add_library(cocemu::cocemu ALIAS cocemu_shared)

foreach(module runtime collectives attention layers train bench)
  install(DIRECTORY ${module}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          PATTERN detail EXCLUDE)
endforeach()
install(TARGETS cocemu_shared EXPORT cocemuTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS cocemu RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/cocemu)

set(_cocemu_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/cocemu)
install(EXPORT cocemuTargets NAMESPACE cocemu:: DESTINATION ${_cocemu_cmake_dir})
configure_package_config_file(cmake/cocemuConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cocemuConfig.cmake INSTALL_DESTINATION ${_cocemu_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cocemuConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cocemuConfig.cmake
              ${PROJECT_BINARY_DIR}/cocemuConfigVersion.cmake
        DESTINATION ${_cocemu_cmake_dir})

# pkg-config: paths relative to the .pc file, so that `--prefix` at install time holds.
file(RELATIVE_PATH _cocemu_pc_to_prefix
  /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" _cocemu_pc_to_prefix "${_cocemu_pc_to_prefix}")
configure_file(cmake/cocemu.pc.in ${PROJECT_BINARY_DIR}/cocemu.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cocemu.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
