file(REMOVE_RECURSE
  "../bin/shmrefd"
  "../bin/shmrefd.pdb"
  "CMakeFiles/shmrefd.dir/shmrefd.c.o"
  "CMakeFiles/shmrefd.dir/shmrefd.c.o.d"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/shmrefd.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
