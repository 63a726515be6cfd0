# SPDX-License-Identifier: MIT
# plot.gp: the chart of the Python benchmark (bench/results/python.png), from the data
# files bench/python/plotdata.py writes (one row per size, one column per method).
#   gnuplot -e "prefix='build-bench/python'; outfile='python.png'; subtitle='...'" bench/python/plot.gp
if (!exists("prefix")) prefix = "python"
if (!exists("outfile")) outfile = "python.png"
if (!exists("subtitle")) subtitle = ""

set terminal pngcairo size 1500,1100 font "sans,11" noenhanced
set output outfile
set datafile separator "\t"
set datafile missing "?"
set logscale y
set format y "%g"
set grid ytics mytics
set mytics 10
set key outside right top vertical
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set ylabel "median round trip (ms, log scale)"

# What users do today in greys, browns and oranges; shared memory by hand, torch and
# iceoryx2 in purples and blues; shmref in greens (the order of methods.ALL).
array rt[12] = ["#9e9e9e", "#616161", "#795548", "#ff9800", "#ce93d8", "#7b1fa2", "#90caf9", "#1e88e5", \
                "#0d47a1", "#a5d6a7", "#66bb6a", "#1b5e20"]
array ts[5] = ["#9e9e9e", "#795548", "#ff9800", "#66bb6a", "#1b5e20"]

set multiplot layout 2,1 title "Python: one float64 array to a server process, which writes its own output (input + 1), and back\n".subtitle
set title "process to process (bench/python/methods.py)"
plot for [c=2:13] prefix."-roundtrip.dat" using c:xtic(1) title columnheader(c) lc rgb rt[c-1]
set title "a Tesseract (apply returns input + 1) served by tesseract-core's runtime, called through its client"
plot for [c=2:6] prefix."-tesseract.dat" using c:xtic(1) title columnheader(c) lc rgb ts[c-1]
unset multiplot
