# install_pc.cmake — run by `cmake --install` (CMakeLists.txt, "install"):
# writes MR_PC_OUT from the configured template MR_PC_IN with the prefix of
# this install. A space in the prefix is escaped, as pkg-config reads its
# values as shell-like words.
string(REPLACE " " "\\ " MR_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
configure_file("${MR_PC_IN}" "${MR_PC_OUT}" @ONLY)
