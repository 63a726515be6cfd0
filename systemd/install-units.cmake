# SPDX-License-Identifier: MIT
# install-units.cmake: run by `cmake --install` (see CMakeLists.txt here, which sets the
# SHMREF_* variables). Works out the paths for the install-time prefix, generates the
# service units naming them, and installs units, sysusers.d entry and example config.
set(prefix "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/+$" "" prefix "${prefix}")

# shmref_dir(VAR GIVEN PKGCONFIG DEFAULT): GIVEN if set (relative: under the prefix),
# else PKGCONFIG when the prefix is /usr, else prefix/DEFAULT.
function(shmref_dir var given pc def)
  if(given)
    if(IS_ABSOLUTE "${given}")
      set(d "${given}")
    else()
      set(d "${prefix}/${given}")
    endif()
  elseif(prefix STREQUAL "/usr" AND pc)
    set(d "${pc}")
  else()
    set(d "${prefix}/${def}")
  endif()
  set(${var} "${d}" PARENT_SCOPE)
endfunction()

if(IS_ABSOLUTE "${SHMREF_SYSCONFDIR}")
  set(confdir "${SHMREF_SYSCONFDIR}")
elseif(prefix STREQUAL "/usr" OR prefix STREQUAL "")
  set(confdir "/etc")
else()
  set(confdir "${prefix}/${SHMREF_SYSCONFDIR}")
endif()
if(IS_ABSOLUTE "${SHMREF_SBINDIR}")
  set(sbindir "${SHMREF_SBINDIR}")
else()
  set(sbindir "${prefix}/${SHMREF_SBINDIR}")
endif()
shmref_dir(system_units "${SHMREF_SYSTEM_UNIT_DIR}" "${SHMREF_PC_SYSTEM_UNIT_DIR}" lib/systemd/system)
shmref_dir(user_units "${SHMREF_USER_UNIT_DIR}" "${SHMREF_PC_USER_UNIT_DIR}" lib/systemd/user)
shmref_dir(sysusers "${SHMREF_SYSUSERS}" "${SHMREF_PC_SYSUSERS_DIR}" lib/sysusers.d)

set(SHMREFD_PATH "${sbindir}/shmrefd")
set(SHMREF_CONFIG "${confdir}/shmrefd/shmrefd.conf")
configure_file("${SHMREF_SRC}/shmrefd.service.in" "${SHMREF_GEN}/shmrefd.service" @ONLY)
configure_file("${SHMREF_SRC}/user/shmrefd.service.in" "${SHMREF_GEN}/user/shmrefd.service" @ONLY)

file(INSTALL DESTINATION "${system_units}" TYPE FILE
  FILES "${SHMREF_SRC}/shmrefd.socket" "${SHMREF_GEN}/shmrefd.service")
file(INSTALL DESTINATION "${user_units}" TYPE FILE
  FILES "${SHMREF_SRC}/user/shmrefd.socket" "${SHMREF_GEN}/user/shmrefd.service")
file(INSTALL DESTINATION "${sysusers}" TYPE FILE RENAME shmrefd.conf FILES "${SHMREF_SRC}/shmrefd.sysusers")
file(INSTALL DESTINATION "${confdir}/shmrefd" TYPE FILE FILES "${SHMREF_SRC}/shmrefd.conf")
