# The Python suite (python/tests, pytest), run in the virtual environment that
# `make python` sets up (the kcache package installed by pip, Triton, llvmlite,
# pytest). Without that environment each test is skipped, saying why.
set(KCACHE_PYTHON_VENV "${CMAKE_BINARY_DIR}/venv" CACHE PATH
    "Virtual environment with the kcache package, Triton, llvmlite and pytest (make python)")
set(_kcache_pytest [=[
venv="$1"; suite="$2"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import kcache, pytest' 2>/dev/null; then
  echo "SKIPPED: no Python environment with kcache and pytest at $venv (make python sets it up)"
  exit 77
fi
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$suite"
]=])
foreach(suite core triton llvmlite)
  add_test(NAME python_${suite}
           COMMAND sh -c "${_kcache_pytest}" kcache-pytest ${KCACHE_PYTHON_VENV}
                   ${PROJECT_SOURCE_DIR}/python/tests/test_${suite}.py
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(python_${suite} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS python)
endforeach()
