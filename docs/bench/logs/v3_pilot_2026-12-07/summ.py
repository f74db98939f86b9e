import re,sys,statistics as st
keys=["rolloutpipe/step_time_s","rolloutpipe/rollout_to_train_end_s","rolloutpipe/rollout_end_s","rolloutpipe/trainer_busy_s","rolloutpipe/first_unit_ready_s","response_length/mean"]
for f in sys.argv[1:]:
    rows=[]
    for line in open(f):
        if "step:" in line and "rolloutpipe/step_time_s" in line:
            d={}
            for k in keys:
                m=re.search(re.escape(k)+r":(?:np\.float64\()?([0-9.e+-]+)",line)
                if m: d[k]=float(m.group(1))
            rows.append(d)
    rows=rows[2:]  # skip 2 warm-up steps
    print(f.split('/')[-1], len(rows), " ".join(f"{k.split('/')[-1]}={st.mean(r[k] for r in rows if k in r):.3f}" for k in keys if any(k in r for r in rows)))
