#!/bin/sh
# The deck's screenshots, cropped to what their slide talks about.
#
# The page screenshots in docs/images/ are 1500 pixels wide; shown whole on a slide they
# shrink to a third and nothing in them can be read from the back of a room. Each crop
# below keeps one region of one screenshot (pixel offsets in the 1500-wide original), so a
# slide shows it at about its own size. The originals stay: other docs use them whole.
# Rerun after a screenshot is retaken, and check each crop by eye: the offsets follow the
# page's layout. Needs ImageMagick's convert (apt-get install imagemagick).
set -eu
cd "$(dirname "$0")/../images"
out=lecture
crop() { convert "$1" -crop "$2" +repage "$out/$3"; }
# two regions of one screenshot, the first above the second
stack() { convert "$1" \( -clone 0 -crop "$2" \) \( -clone 0 -crop "$3" \) -delete 0 -append +repage "$out/$4"; }

# slide 1: make demo's two engines after its first minute, counters and timelines
crop demo-first-minute.png 1468x397+16+162 crop-demo-first-minute-en.png
crop demo-first-minute-zh.png 1468x388+16+140 crop-demo-first-minute-zh.png
# slide 3: one row against 64 rows, same iterations: the counters of each panel up to the queue
stack scenario-02-decode-is-memory-bound.png 612x88+18+380 612x88+756+380 \
    crop-scenario-02-counters.png
# slide 12: the starved background job (outlined row), without aging above, with it below
stack scenario-05-fairness-aging.png 727x232+17+380 727x232+756+380 crop-scenario-05-rows.png
# slide 16: static and continuous side by side, late arrivals running on the right: the
# panels' titles, then their timelines (the counter cards between them left out)
stack scenario-08-misconceptions.png 1458x26+22+386 1458x287+22+490 crop-scenario-08-panels.png
