
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/proto/units.c" "client-lib/CMakeFiles/shmrefctl.dir/__/proto/units.c.o" "gcc" "client-lib/CMakeFiles/shmrefctl.dir/__/proto/units.c.o.d"
  "/work/main/client-lib/shmrefctl.c" "client-lib/CMakeFiles/shmrefctl.dir/shmrefctl.c.o" "gcc" "client-lib/CMakeFiles/shmrefctl.dir/shmrefctl.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build/client-lib/CMakeFiles/shmref.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
