#!/usr/bin/env python3
"""Lists product functions over 120 lines (issue 51: none should be). Usage: scripts/fn_lengths.py collector/src shim/src format/src
Brace-matched by indentation: a function ends at the first line that is its own indent and a closing brace."""
import re,sys,os
pat=re.compile(r'^(\s*)(pub(\([a-z]+\))?\s+)?(const\s+)?(unsafe\s+)?(extern "C"\s+)?fn\s+(\w+)')
out=[]
for root in sys.argv[1:]:
  for dp,dn,fn in os.walk(root):
    if '/tests' in dp or 'target' in dp: continue
    for f in fn:
      if not f.endswith('.rs') or f=='tests.rs' or f.endswith('_tests.rs'): continue
      p=os.path.join(dp,f); L=open(p).read().split('\n')
      intest=False
      for i,l in enumerate(L):
        if re.match(r'^\s*#\[cfg\(test\)\]',l): 
          # skip rest of file if mod tests follows
          if i+1<len(L) and 'mod tests' in L[i+1]: break
        m=pat.match(l)
        if m:
          ind=m.group(1)
          if l.rstrip().endswith(';'): continue
          for j in range(i+1,len(L)):
            if L[j]==ind+'}': out.append((j-i+1,p,i+1,m.group(7))); break
for n,p,i,name in sorted(out,reverse=True):
  if n>120: print(n,p,i,name)
