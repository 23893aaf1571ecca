# ftjit: the floors of cpp/, enforced by the build. A floor's sources see only
# their own floor's headers and those of the floors below it: each floor
# compiles against an include root of its own that holds nothing else
# (symbolic links to the allowed folders), so an #include that climbs a floor
# is "file not found". The floors, lowest first (docs/design.md, "Floors"):
set(FTJIT_FLOORS primitives pyutil signature store batch jit)

# Sets `out` to the include root of `floor` (made under the build tree):
# FTJIT_CPP_DIR/<each floor up to and including `floor`>, and nothing above.
function(ftjit_floor_include_root floor out)
  if(NOT floor IN_LIST FTJIT_FLOORS)
    message(FATAL_ERROR "ftjit: no floor named ${floor} (floors: ${FTJIT_FLOORS})")
  endif()
  set(root "${CMAKE_BINARY_DIR}/floors/${floor}")
  file(MAKE_DIRECTORY "${root}")
  foreach(f IN LISTS FTJIT_FLOORS)
    if(NOT IS_SYMLINK "${root}/${f}")
      file(CREATE_LINK "${FTJIT_CPP_DIR}/${f}" "${root}/${f}" SYMBOLIC)
    endif()
    if(f STREQUAL floor)
      break()
    endif()
  endforeach()
  set(${out} "${root}" PARENT_SCOPE)
endfunction()
