# package.cmake: what `cmake --install` puts where, and the Debian package CPack makes of it
# (`cpack -G DEB` in a build directory; docs/operations.md, "Debian packages").
#
# One package, tracerelay, holds everything: the agent, the service, the tracerelay CLI and the
# loadgen, both systemd units (not enabled), the sysusers.d file of the tracerelay user, the
# example configs in /etc/tracerelay and man pages made from --help. Every host gets the same
# package and enables the unit it runs; the binaries are small, and one package cannot get out
# of step with itself.
# The programs install themselves (tr_program, cmake/tr.cmake).

set(TR_PROGRAMS tracerelay-agent tracerelay-service tracerelay tracerelay-loadgen)

# The units of deploy/systemd name /usr/local (a by-hand install); installed, they name the
# install prefix.
foreach(unit tracerelay-agent.service tracerelay-service.service)
  file(READ ${CMAKE_SOURCE_DIR}/deploy/systemd/${unit} text)
  string(REPLACE "/usr/local/" "${CMAKE_INSTALL_PREFIX}/" text "${text}")
  file(WRITE ${CMAKE_BINARY_DIR}/package/${unit} "${text}")
  install(FILES ${CMAKE_BINARY_DIR}/package/${unit} DESTINATION lib/systemd/system)
endforeach()
install(FILES ${CMAKE_SOURCE_DIR}/deploy/systemd/tracerelay.sysusers.conf
        DESTINATION lib/sysusers.d RENAME tracerelay.conf)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/systemd/agent.env.example
              ${CMAKE_SOURCE_DIR}/deploy/systemd/service.env.example
        DESTINATION /etc/tracerelay)
file(GLOB TR_DOCS ${CMAKE_SOURCE_DIR}/docs/*.md)
install(FILES ${TR_DOCS} ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

# Man pages from --help and --version (help2man), when help2man is there.
find_program(HELP2MAN help2man)
if(HELP2MAN)
  set(TR_MAN_tracerelay-agent "relay this host's Perfetto producers to a tracerelay service")
  set(TR_MAN_tracerelay-service "the central tracing service of a tracerelay cluster")
  set(TR_MAN_tracerelay "record, inspect and watch tracerelay traces")
  set(TR_MAN_tracerelay-loadgen "a Perfetto producer that writes test load")
  set(pages)
  foreach(prog ${TR_PROGRAMS})
    set(page ${CMAKE_BINARY_DIR}/man/${prog}.1.gz)
    add_custom_command(
      OUTPUT ${page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${HELP2MAN} --no-info --no-discard-stderr --name "${TR_MAN_${prog}}"
              --output ${CMAKE_BINARY_DIR}/man/${prog}.1 $<TARGET_FILE:${prog}>
      COMMAND gzip -9nf ${CMAKE_BINARY_DIR}/man/${prog}.1
      DEPENDS ${prog}
      COMMENT "man page of ${prog}"
      VERBATIM)
    list(APPEND pages ${page})
  endforeach()
  add_custom_target(man ALL DEPENDS ${pages})
  install(FILES ${pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(STATUS "help2man not found: no man pages (tools/install-deps.sh installs it)")
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME tracerelay)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "tracerelay maintainers <maintainers@tracerelay.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "one Perfetto trace of a whole cluster")
# CPack puts the summary first and indents these lines itself.
string(CONCAT CPACK_DEBIAN_PACKAGE_DESCRIPTION
       "tracerelay-agent speaks Perfetto's producer protocol on each host and relays the trace\n"
       "data over mutually-authenticated TLS to tracerelay-service, which writes one Perfetto\n"
       "trace with every host on one timeline. Includes the tracerelay CLI, a load generator,\n"
       "systemd units (not enabled) and man pages.")
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX}) # as the units name it: build with /usr
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON) # Depends from the binaries' libraries (dpkg-shlibdeps)
# useradd (postinst); kill (ExecReload); libmicrohttpd, which --metrics-listen loads with dlopen
# (dpkg-shlibdeps cannot see it)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "passwd, procps, libmicrohttpd12")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/deploy/debian/postinst ${CMAKE_SOURCE_DIR}/deploy/debian/prerm
    ${CMAKE_SOURCE_DIR}/deploy/debian/postrm ${CMAKE_SOURCE_DIR}/deploy/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_WARN_ON_ABSOLUTE_INSTALL_DESTINATION OFF) # /etc/tracerelay, on purpose
include(CPack)
