# pkg-config files of tide's libraries: tide-<part>.pc for each part and
# tide-elastic.pc, installed in <libdir>/pkgconfig. The libraries are static,
# so a file names everything a program must link (Requires and Libs, not
# their .private forms). Each file finds the prefix from its own place
# (${pcfiledir}), so an installed tree can move.

# How each library a part links appears in a pkg-config file: a pkg-config
# module ("pc:NAME") or linker flags ("libs:FLAGS"). A library missing here
# stops the configuration, so the files cannot silently fall behind.
set(tide_pkgconfig_of
  "spdlog::spdlog=pc:spdlog"
  "fmt::fmt=pc:fmt"
  "Threads::Threads=libs:-pthread"
  "nlohmann_json::nlohmann_json=pc:nlohmann_json"
  "CURL::libcurl=pc:libcurl"
  "OpenSSL::Crypto=pc:libcrypto"
  "prometheus-cpp::core=pc:prometheus-cpp-core"
  "prometheus-cpp::pull=pc:prometheus-cpp-pull"
  "civetweb::civetweb-cpp=libs:-lcivetweb-cpp -lcivetweb"
  "dl=libs:-ldl")

file(RELATIVE_PATH tide_pc_to_prefix
  "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" tide_pc_to_prefix "${tide_pc_to_prefix}")

# tide_pkgconfig(NAME [ARCHIVE] PARTS tide parts... LIBS libraries...):
# writes and installs tide-NAME.pc; ARCHIVE when libtide_NAME.a exists.
function(tide_pkgconfig name)
  cmake_parse_arguments(P "ARCHIVE" "" "PARTS;LIBS" ${ARGN})
  set(requires)
  set(libs)
  if(P_ARCHIVE)
    set(libs "-L\${libdir} -ltide_${name}")
  endif()
  foreach(part IN LISTS P_PARTS)
    list(APPEND requires "tide-${part}")
  endforeach()
  foreach(lib IN LISTS P_LIBS)
    set(found "")
    foreach(entry IN LISTS tide_pkgconfig_of)
      string(FIND "${entry}" "${lib}=" at)
      if(at EQUAL 0)
        string(LENGTH "${lib}=" skip)
        string(SUBSTRING "${entry}" ${skip} -1 found)
      endif()
    endforeach()
    if(found MATCHES "^pc:(.*)$")
      list(APPEND requires "${CMAKE_MATCH_1}")
    elseif(found MATCHES "^libs:(.*)$")
      string(APPEND libs " ${CMAKE_MATCH_1}")
    else()
      message(FATAL_ERROR
        "tide-${name}.pc: '${lib}' has no entry in cmake/pkgconfig.cmake")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES requires)
  list(JOIN requires " " requires)
  string(STRIP "${libs}" libs)
  set(file "${PROJECT_BINARY_DIR}/pkgconfig/tide-${name}.pc")
  file(WRITE "${file}" "\
prefix=\${pcfiledir}/${tide_pc_to_prefix}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: tide-${name}
Description: tide, the ${name} library (C++20, static)
Version: ${PROJECT_VERSION}
Requires: ${requires}
Libs: ${libs}
Cflags: -I\${includedir}
")
  install(FILES "${file}"
    DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig" COMPONENT dev)
endfunction()
