# What `cmake --install` puts where (docs/install.md), the CMake package
# that find_package(tide) reads, and the Debian packages `cpack -G DEB`
# makes from the same rules:
#
#   component runtime -> package tide:     bin/tiderun, tide-store, tide-timeline
#   component dev     -> package tide-dev: include/tide/, lib/libtide_*.a,
#                        lib/cmake/tide/, lib/pkgconfig/tide-*.pc
#   component python  -> package python3-tide: lib/python3/dist-packages/tide/
#                        (the TIDE backend of torch.distributed.rpc)
#
# The parts' libraries and pkg-config files are installed where they are
# made (src/CMakeLists.txt), the programs in apps/CMakeLists.txt.

include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tide
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

# A stripping install (--strip, and every package) keeps the archives'
# symbol tables but drops their debugging information: CMake strips
# programs only.
set(tide_archives)
get_property(tide_installed_parts GLOBAL PROPERTY TIDE_INSTALLED_PARTS)
foreach(part IN LISTS tide_installed_parts)
  list(APPEND tide_archives "libtide_${part}.a")
endforeach()
install(CODE "
  if(CMAKE_INSTALL_DO_STRIP)
    foreach(archive ${tide_archives})
      execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug
        \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/\${archive}\"
        COMMAND_ERROR_IS_FATAL ANY)
    endforeach()
  endif()" COMPONENT dev)

# find_package(tide): the targets tide::<part>, tide::elastic and
# tide::headers, after the packages they link are found again.
set(tide_config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/tide)
install(EXPORT tideTargets NAMESPACE tide::
  DESTINATION ${tide_config_dir} COMPONENT dev)
set(TIDE_FIND_DEPENDENCIES "")
foreach(dependency IN LISTS TIDE_LIBRARY_DEPENDENCIES)
  string(APPEND TIDE_FIND_DEPENDENCIES "find_dependency(${dependency})\n")
endforeach()
configure_package_config_file(cmake/tideConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/tideConfig.cmake
  INSTALL_DESTINATION ${tide_config_dir})
# 0.x: a minor version may change the API.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/tideConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/tideConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/tideConfigVersion.cmake
  DESTINATION ${tide_config_dir} COMPONENT dev)

# Debian packages. tide's dependencies come from dpkg-shlibdeps on the
# programs; tide-dev's are the packages owning what TIDE_LIBRARY_DEPENDENCIES
# found (a config file or a library), asked of dpkg when cpack runs
# (cmake/cpack_project.cmake).
set(CPACK_TIDE_DEPENDENCY_FILES)
foreach(dependency IN LISTS TIDE_LIBRARY_DEPENDENCIES)
  separate_arguments(words UNIX_COMMAND "${dependency}")
  list(GET words 0 name)
  if(${name}_CONFIG)
    list(APPEND CPACK_TIDE_DEPENDENCY_FILES "${${name}_CONFIG}")
  elseif(${name}_LIBRARY)
    list(APPEND CPACK_TIDE_DEPENDENCY_FILES "${${name}_LIBRARY}")
  elseif(name STREQUAL "OpenSSL")  # its find module names the file so
    list(APPEND CPACK_TIDE_DEPENDENCY_FILES "${OPENSSL_CRYPTO_LIBRARY}")
  elseif(NOT name STREQUAL "Threads")  # Threads: the C library's own
    message(FATAL_ERROR "cmake/install.cmake: no file tells which Debian "
      "package provides '${name}'")
  endif()
endforeach()

# Each package's /usr/share/doc/<package>/copyright, in Debian's
# machine-readable form, from LICENSE (BSD-3-Clause).
file(READ ${PROJECT_SOURCE_DIR}/LICENSE tide_license)
string(REGEX REPLACE "^BSD 3-Clause License\n\n" "" tide_license "${tide_license}")
string(REGEX REPLACE "\n\n" "\n.\n" tide_license "${tide_license}")
string(REGEX REPLACE "\n([^\n])" "\n \\1" tide_license "${tide_license}")
file(WRITE ${PROJECT_BINARY_DIR}/copyright
  "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
  "Upstream-Name: tide\n\n"
  "Files: *\nCopyright: 2026 the tide developers\nLicense: BSD-3-Clause\n"
  " ${tide_license}")
set(tide_packages runtime tide dev tide-dev)
if(TIDE_PYTHON AND NOT TIDE_SANITIZE)
  list(APPEND tide_packages python python3-tide)
endif()
while(tide_packages)
  list(POP_FRONT tide_packages component package)
  install(FILES ${PROJECT_BINARY_DIR}/copyright
    DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package} COMPONENT ${component})
endwhile()

# The Maintainer field: whoever builds the packages, named as Debian's own
# tools take it (DEBFULLNAME and DEBEMAIL), or -DTIDE_PACKAGE_MAINTAINER.
set(tide_default_maintainer "tide developers <tide@localhost>")
if(DEFINED ENV{DEBEMAIL} AND NOT "$ENV{DEBEMAIL}" STREQUAL "")
  set(tide_default_maintainer "$ENV{DEBFULLNAME} <$ENV{DEBEMAIL}>")
  string(STRIP "${tide_default_maintainer}" tide_default_maintainer)
endif()
set(TIDE_PACKAGE_MAINTAINER "${tide_default_maintainer}" CACHE STRING
  "the Debian packages' Maintainer field (default: DEBFULLNAME <DEBEMAIL>)")

set(CPACK_PACKAGE_NAME tide)
set(CPACK_PACKAGE_VENDOR tide)
set(CPACK_PACKAGE_CONTACT "${TIDE_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "native runtime for fault-tolerant and elastic distributed training")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
if(TIDE_PYTHON AND NOT TIDE_SANITIZE)
  list(APPEND CPACK_COMPONENTS_ALL python)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME tide)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
  "tiderun, a drop-in for torchrun, with tide-store and tide-timeline")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME tide-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "tide (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "tide's C++ libraries: headers, static libraries, CMake package, pkg-config files")
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-tide)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3-torch")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION
  "tide as a backend of torch.distributed.rpc: import tide.torch_rpc, then backend=BackendType.TIDE")
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_SOURCE_DIR}/cmake/cpack_project.cmake)
include(CPack)
