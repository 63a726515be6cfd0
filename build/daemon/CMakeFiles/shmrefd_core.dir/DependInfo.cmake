
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/daemon/broker.c" "daemon/CMakeFiles/shmrefd_core.dir/broker.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/broker.c.o.d"
  "/work/main/daemon/conn.c" "daemon/CMakeFiles/shmrefd_core.dir/conn.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/conn.c.o.d"
  "/work/main/daemon/log.c" "daemon/CMakeFiles/shmrefd_core.dir/log.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/log.c.o.d"
  "/work/main/daemon/options.c" "daemon/CMakeFiles/shmrefd_core.dir/options.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/options.c.o.d"
  "/work/main/daemon/pool.c" "daemon/CMakeFiles/shmrefd_core.dir/pool.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/pool.c.o.d"
  "/work/main/daemon/quota.c" "daemon/CMakeFiles/shmrefd_core.dir/quota.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/quota.c.o.d"
  "/work/main/daemon/registry.c" "daemon/CMakeFiles/shmrefd_core.dir/registry.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/registry.c.o.d"
  "/work/main/daemon/server.c" "daemon/CMakeFiles/shmrefd_core.dir/server.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/server.c.o.d"
  "/work/main/daemon/status.c" "daemon/CMakeFiles/shmrefd_core.dir/status.c.o" "gcc" "daemon/CMakeFiles/shmrefd_core.dir/status.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build/proto/CMakeFiles/shmref_proto.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
