# What the staged bench/gpu scripts share; source it after setting `stages` (a comma-separated list),
# from the repository root: `has STAGE`, src (the checkout), DEB_DIR (the GPU build's Debian packages,
# carried in .gpu/), t_start, and the build stage.
has() { [[ ",$stages," == *",$1,"* ]]; }
src=$PWD
export DEB_DIR=$src/.gpu/debs
t_start=$(date +%s)

# Stage `build`: scripts/gpu/build.sh into build-gpu, its log in $OUT/build.log; a failed build
# prints its errors and the log's tail and ends the script.
build_stage() {
  has build || return 0
  scripts/gpu/build.sh build-gpu > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t_start )) s"
}
