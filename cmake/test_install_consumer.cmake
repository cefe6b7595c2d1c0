# ctest `install_consumer` (cmake -P): installs the build in KVBLOCK_BUILD_DIR into a fresh prefix
# under WORK_DIR, then
#   1. checks the installed files (versioned library and its links, headers, package files),
#   2. builds and runs cmake/consumer through find_package(kvblock CONFIG) against that prefix,
#   3. builds and runs it through add_subdirectory of the source tree (same target name),
#   4. compiles and runs cmake/consumer/main.c with `pkg-config --cflags --libs kvblock`.
foreach(var KVBLOCK_BUILD_DIR KVBLOCK_SOURCE_DIR KVBLOCK_VERSION WORK_DIR CMAKE_GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "${var} is not set")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(RUN_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run("${CMAKE_COMMAND}" --install "${KVBLOCK_BUILD_DIR}" --prefix "${prefix}" --component kvblock)

# 1. The layout.
set(expected include/kvblock.h include/kvblock.hpp include/kvblock_disagg.hpp
    include/kvblock_trtllm.hpp
    include/kvblock/config.hpp include/kvblock/error.hpp include/kvblock/event.hpp
    include/kvblock/request.hpp
    include/kvblock_trtllm/request.hpp include/kvblock_trtllm/types.hpp
    include/kvblock_trtllm/block_manager.hpp include/kvblock_trtllm/sizing.hpp
    include/kvblock_trtllm/kv_cache_manager.hpp
    include/kvblock_trtllm/block_manager_inl.hpp include/kvblock_trtllm/vocabulary.hpp
    include/kvblock_trtllm/executor_types.hpp include/kvblock_trtllm/generation_request.hpp
    include/kvblock_trtllm/kv_cache_manager_sequences.hpp
    include/kvblock_trtllm/kv_cache_manager_reuse.hpp
    include/kvblock_trtllm/block.hpp include/kvblock_trtllm/connector.hpp
    include/kvblock_trtllm/kv_cache_manager_pools.hpp include/kvblock_trtllm/tensor.hpp
    include/kvblock_trtllm/kv_cache_index.hpp include/kvblock_trtllm/buffer_manager.hpp
    include/kvblock_trtllm/transfer_manager.hpp
    lib/cmake/kvblock/kvblockConfig.cmake
    lib/cmake/kvblock/kvblockConfigVersion.cmake lib/pkgconfig/kvblock.pc)
if(KVBLOCK_SONAME)
  list(APPEND expected lib/libkvblock.so.${KVBLOCK_VERSION} lib/${KVBLOCK_SONAME} lib/libkvblock.so)
  if(NOT IS_SYMLINK "${prefix}/lib/${KVBLOCK_SONAME}" OR NOT IS_SYMLINK "${prefix}/lib/libkvblock.so")
    message(FATAL_ERROR "lib/${KVBLOCK_SONAME} and lib/libkvblock.so must be symbolic links")
  endif()
endif()
foreach(file IN LISTS expected)
  if(NOT EXISTS "${prefix}/${file}")
    message(FATAL_ERROR "not installed: ${file}")
  endif()
endforeach()

# 2. and 3. The CMake consumer, both ways.
foreach(mode package subdirectory)
  set(build "${WORK_DIR}/consumer-${mode}")
  set(args -DKVBLOCK_EXPECTED_VERSION=${KVBLOCK_VERSION} -DCMAKE_BUILD_TYPE=Release)
  if(mode STREQUAL "package")
    list(APPEND args "-DCMAKE_PREFIX_PATH=${prefix}")
  else()
    list(APPEND args -DCONSUMER_VIA_SUBDIRECTORY=ON "-DKVBLOCK_SOURCE_DIR=${KVBLOCK_SOURCE_DIR}")
  endif()
  run("${CMAKE_COMMAND}" -S "${KVBLOCK_SOURCE_DIR}/cmake/consumer" -B "${build}" -G "${CMAKE_GENERATOR}" ${args})
  run("${CMAKE_COMMAND}" --build "${build}")
  run("${build}/consumer")
  message(STATUS "${mode}: ${RUN_OUTPUT}")
endforeach()
# The package consumer links the installed library, not the build tree's.
if(KVBLOCK_SONAME)
  run(readelf -d "${WORK_DIR}/consumer-package/consumer")
  if(NOT RUN_OUTPUT MATCHES "NEEDED[^\n]*\\[${KVBLOCK_SONAME}\\]" OR NOT RUN_OUTPUT MATCHES "${prefix}/lib")
    message(FATAL_ERROR "the package consumer does not need ${KVBLOCK_SONAME} from ${prefix}/lib:\n${RUN_OUTPUT}")
  endif()
endif()

# 4. pkg-config, from C.
find_program(PKG_CONFIG pkg-config REQUIRED)
find_program(CC NAMES cc gcc clang REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
run("${PKG_CONFIG}" --modversion kvblock)
string(STRIP "${RUN_OUTPUT}" pc_version)
if(NOT pc_version STREQUAL KVBLOCK_VERSION)
  message(FATAL_ERROR "pkg-config reports ${pc_version}, expected ${KVBLOCK_VERSION}")
endif()
run("${PKG_CONFIG}" --cflags --libs kvblock)
string(STRIP "${RUN_OUTPUT}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run("${CC}" -std=c99 -Wall -Wextra -Werror "${KVBLOCK_SOURCE_DIR}/cmake/consumer/main.c" ${flags}
    -o "${WORK_DIR}/c_consumer")
run("${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${prefix}/lib" "${WORK_DIR}/c_consumer")
string(STRIP "${RUN_OUTPUT}" c_version)
if(NOT c_version STREQUAL KVBLOCK_VERSION)
  message(FATAL_ERROR "the C consumer printed ${c_version}, expected ${KVBLOCK_VERSION}")
endif()
message(STATUS "install_consumer: installed ${KVBLOCK_VERSION} to ${prefix}; CMake package, "
               "add_subdirectory and pkg-config consumers built and ran")
