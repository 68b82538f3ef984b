# Sums Nsight Compute's per-kernel durations by kernel name: where a captured step's device time goes.
#   ncu --metrics gpu__time_duration.sum --launch-skip 500 --launch-count 190 --csv parity train ... > ncu.csv
#   python3 bench/lab/ncu_summary.py ncu.csv [TOP]
import csv,os,collections,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=None; out=[]
for r in rows:
    if 'Kernel Name' in r: hdr=r; continue
    if hdr and len(r)==len(hdr):
        d=dict(zip(hdr,r))
        if d.get('Metric Name')=='gpu__time_duration.sum':
            out.append((d['Kernel Name'],float(d['Metric Value'].replace(',',''))/1e3))
agg=collections.defaultdict(lambda:[0,0.0])
for n,t in out:
    k=n.split('(')[0][:90]; agg[k][0]+=1; agg[k][1]+=t
tot=sum(v[1] for v in agg.values())
print(f"total {tot:.0f} us over {len(out)} kernels")
for k,v in sorted(agg.items(),key=lambda x:-x[1][1])[:int(sys.argv[2]) if len(sys.argv) > 2 else 30]: print(f"{v[1]:9.0f} us {v[0]:4d}x  {k}")
