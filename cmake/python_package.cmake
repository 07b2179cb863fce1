# The Python wheel (pyproject.toml, scikit-build-core): libxte and the GPU plugins built here go
# into the package as xte/lib/, next to each other (libxte finds its plugins beside itself:
# src/registry.c), with an $ORIGIN run path. Active only in a scikit-build-core build (SKBUILD);
# the rules use the install component "python", the only one pyproject.toml installs, so the C
# headers, CMake package files and pkg-config file of the ordinary install stay out of the wheel.
if(NOT DEFINED SKBUILD)
  return()
endif()

# One file per library in the wheel (a wheel has no symlinks: libxte.so -> .so.0 -> .so.0.1.0
# would be three copies): no VERSION / SOVERSION, so the file and its SONAME are libxte.so.
set_property(TARGET xte PROPERTY VERSION)
set_property(TARGET xte PROPERTY SOVERSION)

set(XTE_WHEEL_LIBDIR xte/lib)
foreach(t xte xte_cuda xte_musa)
  if(TARGET ${t})
    get_target_property(XTE_RPATH ${t} INSTALL_RPATH) # the MUSA plugin's runtime directory
    if(XTE_RPATH)
      set(XTE_RPATH "$ORIGIN;${XTE_RPATH}")
    else()
      set(XTE_RPATH "$ORIGIN")
    endif()
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "${XTE_RPATH}")
    install(TARGETS ${t} LIBRARY DESTINATION ${XTE_WHEEL_LIBDIR} COMPONENT python)
    list(APPEND XTE_WHEEL_LIBS ${t})
  endif()
endforeach()
message(STATUS "xte: Python wheel, ${XTE_WHEEL_LIBS} installed to ${XTE_WHEEL_LIBDIR}/")
