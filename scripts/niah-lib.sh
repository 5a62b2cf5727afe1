# Shared by the resumable needle scripts (sourced, not run): one `tq niah` run into one JSON file.
#   niah_one OUT NICE TQ ARG...   runs `nice -n NICE TQ niah ARG... --json` into OUT (through
#                                 OUT.tmp, moved into place on success); an existing non-empty
#                                 OUT is skipped; a failure leaves the error in OUT minus .json + .err
niah_one() {
  local out=$1 nice=$2 tq=$3
  shift 3
  if [[ -s $out ]]; then echo "skip $out (exists)"; return 0; fi
  echo "$(date -u +%H:%M:%S) start $out"
  if nice -n "$nice" "$tq" niah "$@" --json > "$out.tmp" 2> "${out%.json}.err"; then
    mv "$out.tmp" "$out"
    rm -f "${out%.json}.err"
    echo "$(date -u +%H:%M:%S) done  $out: $(python3 -c "import json, sys; j = json.load(open(sys.argv[1])); print(j['passed'], '/', j['trials'])" "$out")"
  else
    rm -f "$out.tmp"
    echo "$(date -u +%H:%M:%S) FAILED $out (see ${out%.json}.err)"
  fi
}
