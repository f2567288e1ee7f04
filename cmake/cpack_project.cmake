# Read by cpack. tide-dev depends on the Debian packages that own the
# files of tide's library dependencies (cmake/install.cmake lists them), so
# the list follows what the build found instead of being kept by hand.
if(CPACK_GENERATOR STREQUAL "DEB")
  set(packages)
  foreach(file IN LISTS CPACK_TIDE_DEPENDENCY_FILES)
    execute_process(COMMAND dpkg-query --search "${file}"
      OUTPUT_VARIABLE owner RESULT_VARIABLE failed ERROR_VARIABLE why)
    # "libspdlog-dev:amd64: /usr/lib/..." -> libspdlog-dev
    if(failed OR NOT owner MATCHES "^([^:, ]+)")
      message(FATAL_ERROR "tide-dev: no Debian package owns ${file}: ${why}")
    endif()
    list(APPEND packages ${CMAKE_MATCH_1})
  endforeach()
  list(REMOVE_DUPLICATES packages)
  list(JOIN packages ", " CPACK_DEBIAN_DEV_PACKAGE_DEPENDS)
endif()
