# Install rules (included by the top-level CMakeLists.txt when KVBLOCK_INSTALL is ON):
#
#   <prefix>/lib/libkvblock.so.X.Y.Z            the library (SONAME libkvblock.so.X)
#   <prefix>/lib/libkvblock.so.X, libkvblock.so symbolic links to it
#   <prefix>/include/kvblock.h, kvblock.hpp (with kvblock/*.hpp), kvblock_disagg.hpp,
#   kvblock_trtllm.hpp and
#   kvblock_trtllm/*.hpp
#   <prefix>/lib/cmake/kvblock/                 find_package(kvblock CONFIG) -> kvblock::kvblock
#   <prefix>/lib/pkgconfig/kvblock.pc           pkg-config --cflags --libs kvblock
#
# Everything is in the install component "kvblock" (the Python wheel installs only "python").
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_kvblock_lib_name "${CMAKE_SHARED_LIBRARY_PREFIX}kvblock${CMAKE_SHARED_LIBRARY_SUFFIX}")
if(KVBLOCK_SONAME)
  set(KVBLOCK_INSTALLED_LIBRARY "${_kvblock_lib_name}.${PROJECT_VERSION}")
  install(FILES "${KVBLOCK_LIBRARY_FILE}" RENAME "${KVBLOCK_INSTALLED_LIBRARY}"
          DESTINATION "${CMAKE_INSTALL_LIBDIR}"
          PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                      WORLD_READ WORLD_EXECUTE
          COMPONENT kvblock)
  # The links (libkvblock.so.X for the loader, libkvblock.so for the linker), made at build time
  # and installed as links.
  set(_kvblock_links "${CMAKE_CURRENT_BINARY_DIR}/kvblock_install_links")
  file(MAKE_DIRECTORY "${_kvblock_links}")
  file(CREATE_LINK "${KVBLOCK_INSTALLED_LIBRARY}" "${_kvblock_links}/${KVBLOCK_SONAME}" SYMBOLIC)
  file(CREATE_LINK "${KVBLOCK_SONAME}" "${_kvblock_links}/${_kvblock_lib_name}" SYMBOLIC)
  install(FILES "${_kvblock_links}/${KVBLOCK_SONAME}" "${_kvblock_links}/${_kvblock_lib_name}"
          DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT kvblock)
else()
  set(KVBLOCK_INSTALLED_LIBRARY "${_kvblock_lib_name}")
  install(FILES "${KVBLOCK_LIBRARY_FILE}" DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT kvblock)
endif()

install(FILES "${PROJECT_SOURCE_DIR}/include/kvblock.h" "${PROJECT_SOURCE_DIR}/include/kvblock.hpp"
              "${PROJECT_SOURCE_DIR}/include/kvblock_disagg.hpp"
              "${PROJECT_SOURCE_DIR}/include/kvblock_trtllm.hpp"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT kvblock)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/kvblock"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT kvblock FILES_MATCHING PATTERN "*.hpp")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/kvblock_trtllm"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT kvblock FILES_MATCHING PATTERN "*.hpp")

set(_kvblock_cmake_dir "${CMAKE_INSTALL_LIBDIR}/cmake/kvblock")
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/kvblockConfig.cmake.in"
  "${CMAKE_CURRENT_BINARY_DIR}/kvblockConfig.cmake"
  INSTALL_DESTINATION "${_kvblock_cmake_dir}"
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
# Same major version = same ABI (the compatibility promise in kvblock.h).
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/kvblockConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMajorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/kvblockConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/kvblockConfigVersion.cmake"
        DESTINATION "${_kvblock_cmake_dir}" COMPONENT kvblock)

# Relocatable: the prefix is found from the .pc file's own directory, so `cmake --install
# --prefix DIR` works wherever DIR is.
file(RELATIVE_PATH KVBLOCK_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
configure_file("${PROJECT_SOURCE_DIR}/cmake/kvblock.pc.in" "${CMAKE_CURRENT_BINARY_DIR}/kvblock.pc" @ONLY)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/kvblock.pc"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig" COMPONENT kvblock)

if(KVBLOCK_BUILD_TESTS)
  # Installs this build into a temporary prefix, then builds and runs cmake/consumer against it:
  # through find_package(kvblock CONFIG), through add_subdirectory, and a C program through
  # pkg-config.
  add_test(NAME install_consumer
    COMMAND "${CMAKE_COMMAND}"
            -DKVBLOCK_BUILD_DIR=${PROJECT_BINARY_DIR}
            -DKVBLOCK_SOURCE_DIR=${PROJECT_SOURCE_DIR}
            -DKVBLOCK_VERSION=${PROJECT_VERSION}
            -DKVBLOCK_SONAME=${KVBLOCK_SONAME}
            -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/install_consumer
            -DCMAKE_GENERATOR=${CMAKE_GENERATOR}
            -P "${PROJECT_SOURCE_DIR}/cmake/test_install_consumer.cmake")
  set_tests_properties(install_consumer PROPERTIES TIMEOUT 300)
endif()
