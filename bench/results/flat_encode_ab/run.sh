cd /work/main
G=../shared/data/glove100/glove100_base.fvecs; F=data/fashion-mnist/train.bvecs; M=data/bench/glove1m_base.fvecs
out=/work/runs/fit/build_ab.jsonl; : > $out
for round in 1 2 3 4 5; do
  for spec in "glove100k 4b|$G|--bits 4" "glove100k 2b|$G|--bits 2" "fashion 4b l2|$F|--bits 4 --metric l2" "glove1m 4b|$M|--bits 4"; do
    name=${spec%%|*}; rest=${spec#*|}; f=${rest%%|*}; a=${rest#*|}
    for side in before after; do
      b=/work/runs/newb; [ $side = after ] && b=/work/runs/fitb
      s=$($b/tq index build -i $f -o /work/runs/fit/ab_$side.tqi $a -t 2 --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['build_s'])")
      echo "{\"round\": $round, \"set\": \"$name\", \"build\": \"$side\", \"args\": \"$a\", \"threads\": 2, \"loadavg_1min\": $(cut -d' ' -f1 /proc/loadavg), \"build_s\": $s}" >> $out
    done
  done
done
echo done > /work/runs/fit/ab.done
