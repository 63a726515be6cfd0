
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/proto/desc.c" "proto/CMakeFiles/shmref_proto.dir/desc.c.o" "gcc" "proto/CMakeFiles/shmref_proto.dir/desc.c.o.d"
  "/work/main/proto/paths.c" "proto/CMakeFiles/shmref_proto.dir/paths.c.o" "gcc" "proto/CMakeFiles/shmref_proto.dir/paths.c.o.d"
  "/work/main/proto/proto.c" "proto/CMakeFiles/shmref_proto.dir/proto.c.o" "gcc" "proto/CMakeFiles/shmref_proto.dir/proto.c.o.d"
  "/work/main/proto/units.c" "proto/CMakeFiles/shmref_proto.dir/units.c.o" "gcc" "proto/CMakeFiles/shmref_proto.dir/units.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
